// Go driver (mongo-go-driver 1.8.4, Debian's golang-mongodb-mongo-driver-dev) interop against
// a live Tributary server.
//
// Usage, offline against the Debian package (GOPATH mode, no go.mod, no module download):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go run tests/go/interop.go mongodb://127.0.0.1:PORT/
//
// On a fresh database each: inserts, updates and deletes read back; watch() sees insert, update
// and delete events; the same stream resumes with no gap and no duplicate after a second client
// finds its cursor with currentOp (idleCursors) and kills it; a WithTransaction commit shows
// both inserts, with one lsid and txnNumber, and an aborted transaction leaves nothing; an update
// on a collection with changeStreamPreAndPostImages carries fullDocumentBeforeChange. The last
// line is "N passed, N failed"; the exit status is non-zero if any check failed.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/bson"
	"go.mongodb.org/mongo-driver/mongo"
	"go.mongodb.org/mongo-driver/mongo/options"
)

const wait = 15 * time.Second

// A check gets a fresh database (dropped afterwards) and the URI, for a second client.
type check struct {
	name string
	run  func(ctx context.Context, db *mongo.Database, uri string) error
}

var checks = []check{
	{"writesReadBack", writesReadBack},
	{"watchSeesInsertUpdateDelete", watchSeesInsertUpdateDelete},
	{"streamResumesAfterItsCursorIsKilled", streamResumesAfterItsCursorIsKilled},
	{"transactionCommitsBothWithOneLsid", transactionCommitsBothWithOneLsid},
	{"abortedTransactionLeavesNothing", abortedTransactionLeavesNothing},
	{"updateEventCarriesThePreImage", updateEventCarriesThePreImage},
}

// A change stream or a plain tailable cursor: what nextEvent reads from.
type eventCursor interface {
	Next(ctx context.Context) bool
	Decode(val interface{}) error
	Err() error
}

// nextEvent returns the next event, waiting at most `wait`.
func nextEvent(c eventCursor) (bson.Raw, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if !c.Next(ctx) {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no change event within %v", wait)
		}
		return nil, fmt.Errorf("the change stream failed: %w", c.Err())
	}
	var ev bson.Raw
	if err := c.Decode(&ev); err != nil {
		return nil, err
	}
	return ev, nil
}

// watch opens a change stream on coll now (the Go driver runs the aggregate eagerly).
func watch(ctx context.Context, coll *mongo.Collection) (*mongo.ChangeStream, error) {
	return coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetMaxAwaitTime(200*time.Millisecond))
}

// sameDoc reports whether got is byte for byte the BSON of want (same fields, order and types).
func sameDoc(got bson.RawValue, want bson.D) error {
	wantRaw, err := bson.Marshal(want)
	if err != nil {
		return err
	}
	doc, ok := got.DocumentOK()
	if !ok || !bytes.Equal(doc, wantRaw) {
		return fmt.Errorf("got %v, want %v", got, bson.Raw(wantRaw))
	}
	return nil
}

// expectEvent checks an event's operationType and documentKey._id.
func expectEvent(ev bson.Raw, op string, id int32) error {
	gotOp := ev.Lookup("operationType").StringValue()
	gotID, ok := ev.Lookup("documentKey", "_id").Int32OK()
	if gotOp != op || !ok || gotID != id {
		return fmt.Errorf("got %v, want operationType %q and documentKey {_id: %d}", ev, op, id)
	}
	return nil
}

func writesReadBack(ctx context.Context, db *mongo.Database, _ string) error {
	coll := db.Collection("c")
	docs := []interface{}{
		bson.D{{"_id", int32(1)}, {"name", "a"}, {"n", int32(1)}},
		bson.D{{"_id", int32(2)}, {"name", "b"}, {"n", int32(1)}},
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		return err
	}
	upd, err := coll.UpdateOne(ctx, bson.D{{"_id", int32(1)}}, bson.D{{"$set", bson.D{{"n", int32(2)}}}})
	if err != nil {
		return err
	}
	if upd.MatchedCount != 1 || upd.ModifiedCount != 1 {
		return fmt.Errorf("updateOne matched %d, modified %d", upd.MatchedCount, upd.ModifiedCount)
	}
	del, err := coll.DeleteOne(ctx, bson.D{{"_id", int32(2)}})
	if err != nil {
		return err
	}
	if del.DeletedCount != 1 {
		return fmt.Errorf("deleteOne deleted %d", del.DeletedCount)
	}
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{"_id", 1}}))
	if err != nil {
		return err
	}
	var got []bson.Raw
	if err := cur.All(ctx, &got); err != nil {
		return err
	}
	if len(got) != 1 {
		return fmt.Errorf("read back %d documents, want 1: %v", len(got), got)
	}
	return sameDoc(bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: got[0]},
		bson.D{{"_id", int32(1)}, {"name", "a"}, {"n", int32(2)}})
}

func watchSeesInsertUpdateDelete(ctx context.Context, db *mongo.Database, _ string) error {
	coll := db.Collection("c")
	stream, err := watch(ctx, coll)
	if err != nil {
		return err
	}
	defer stream.Close(ctx)
	inserted := bson.D{{"_id", int32(1)}, {"a", int32(1)}}
	if _, err := coll.InsertOne(ctx, inserted); err != nil {
		return err
	}
	if _, err := coll.UpdateOne(ctx, bson.D{{"_id", int32(1)}}, bson.D{{"$set", bson.D{{"a", int32(2)}}}}); err != nil {
		return err
	}
	if _, err := coll.DeleteOne(ctx, bson.D{{"_id", int32(1)}}); err != nil {
		return err
	}
	ins, err := nextEvent(stream)
	if err != nil {
		return err
	}
	if err := expectEvent(ins, "insert", 1); err != nil {
		return err
	}
	if err := sameDoc(ins.Lookup("fullDocument"), inserted); err != nil {
		return fmt.Errorf("insert fullDocument: %w", err)
	}
	upd, err := nextEvent(stream)
	if err != nil {
		return err
	}
	if err := expectEvent(upd, "update", 1); err != nil {
		return err
	}
	if err := sameDoc(upd.Lookup("updateDescription", "updatedFields"), bson.D{{"a", int32(2)}}); err != nil {
		return fmt.Errorf("updatedFields: %w", err)
	}
	del, err := nextEvent(stream)
	if err != nil {
		return err
	}
	return expectEvent(del, "delete", 1)
}

// idleCursorIDs lists the cursor ids that currentOp (idleCursors: true) shows for ns.
func idleCursorIDs(ctx context.Context, client *mongo.Client, ns string) ([]int64, error) {
	var reply bson.Raw
	cmd := bson.D{{"currentOp", 1}, {"idleCursors", true}}
	if err := client.Database("admin").RunCommand(ctx, cmd).Decode(&reply); err != nil {
		return nil, err
	}
	ops, err := reply.Lookup("inprog").Array().Values()
	if err != nil {
		return nil, err
	}
	var ids []int64
	for _, op := range ops {
		entry := op.Document()
		if entry.Lookup("type").StringValue() == "idleCursor" && entry.Lookup("ns").StringValue() == ns {
			id, ok := entry.Lookup("cursor", "cursorId").AsInt64OK()
			if !ok {
				return nil, fmt.Errorf("an idleCursor entry without cursor.cursorId: %v", entry)
			}
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func streamResumesAfterItsCursorIsKilled(ctx context.Context, db *mongo.Database, uri string) error {
	coll := db.Collection("c")
	stream, err := watch(ctx, coll)
	if err != nil {
		return err
	}
	defer stream.Close(ctx)
	if _, err := coll.InsertOne(ctx, bson.D{{"_id", int32(1)}}); err != nil {
		return err
	}
	ev, err := nextEvent(stream)
	if err != nil {
		return err
	}
	if err := expectEvent(ev, "insert", 1); err != nil {
		return err
	}

	// A second client finds the stream's cursor on the server and kills it.
	other, err := mongo.Connect(ctx, options.Client().ApplyURI(uri))
	if err != nil {
		return err
	}
	defer other.Disconnect(ctx)
	ns := db.Name() + ".c"
	ids, err := idleCursorIDs(ctx, other, ns)
	if err != nil {
		return err
	}
	if len(ids) != 1 || ids[0] != stream.ID() {
		return fmt.Errorf("currentOp idle cursors on %s: %v, want [%d] (the stream's)", ns, ids, stream.ID())
	}
	var killed bson.Raw
	kill := bson.D{{"killCursors", "c"}, {"cursors", bson.A{ids[0]}}}
	if err := other.Database(db.Name()).RunCommand(ctx, kill).Decode(&killed); err != nil {
		return err
	}
	if got, _ := killed.Lookup("cursorsKilled").Array().Values(); len(got) != 1 || got[0].AsInt64() != ids[0] {
		return fmt.Errorf("killCursors replied %v", killed)
	}

	// The next getMore fails with CursorNotFound; the driver resumes after event 1.
	for _, id := range []int32{2, 3} {
		if _, err := coll.InsertOne(ctx, bson.D{{"_id", id}}); err != nil {
			return err
		}
	}
	for _, id := range []int32{2, 3} {
		ev, err := nextEvent(stream)
		if err != nil {
			return fmt.Errorf("after the kill: %w", err)
		}
		if err := expectEvent(ev, "insert", id); err != nil {
			return fmt.Errorf("after the kill (a gap or a duplicate): %w", err)
		}
	}
	if stream.ID() == ids[0] || stream.ID() == 0 {
		return fmt.Errorf("no new cursor after the resume: %d", stream.ID())
	}
	return nil
}

// watchInSession opens a change stream on coll, then a session to write in while it watches.
func watchInSession(ctx context.Context, db *mongo.Database, coll *mongo.Collection) (*mongo.ChangeStream, mongo.Session, error) {
	stream, err := watch(ctx, coll)
	if err != nil {
		return nil, nil, err
	}
	sess, err := db.Client().StartSession()
	if err != nil {
		stream.Close(ctx)
		return nil, nil, err
	}
	return stream, sess, nil
}

func transactionCommitsBothWithOneLsid(ctx context.Context, db *mongo.Database, _ string) error {
	coll := db.Collection("c")
	if err := db.CreateCollection(ctx, "c"); err != nil {
		return err
	}
	stream, sess, err := watchInSession(ctx, db, coll)
	if err != nil {
		return err
	}
	defer stream.Close(ctx)
	defer sess.EndSession(ctx)
	_, err = sess.WithTransaction(ctx, func(sc mongo.SessionContext) (interface{}, error) {
		for _, id := range []int32{1, 2} {
			if _, err := coll.InsertOne(sc, bson.D{{"_id", id}}); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	if err != nil {
		return err
	}
	if _, err := coll.InsertOne(ctx, bson.D{{"_id", int32(3)}}); err != nil {
		return err
	}
	n, err := coll.CountDocuments(ctx, bson.D{{"_id", bson.D{{"$in", bson.A{1, 2}}}}})
	if err != nil {
		return err
	}
	if n != 2 {
		return fmt.Errorf("%d of the 2 committed documents visible", n)
	}
	var events []bson.Raw
	for _, id := range []int32{1, 2, 3} {
		ev, err := nextEvent(stream)
		if err != nil {
			return err
		}
		if err := expectEvent(ev, "insert", id); err != nil {
			return err
		}
		events = append(events, ev)
	}
	wantID := sess.ID().Lookup("id")
	for _, ev := range events[:2] {
		if !ev.Lookup("lsid", "id").Equal(wantID) {
			return fmt.Errorf("event lsid %v, want the session's id %v", ev.Lookup("lsid"), wantID)
		}
		if _, err := ev.LookupErr("txnNumber"); err != nil {
			return fmt.Errorf("a transaction's event without txnNumber: %v", ev)
		}
	}
	if !events[0].Lookup("txnNumber").Equal(events[1].Lookup("txnNumber")) {
		return fmt.Errorf("txnNumbers differ: %v and %v", events[0].Lookup("txnNumber"), events[1].Lookup("txnNumber"))
	}
	if _, err := events[2].LookupErr("txnNumber"); err == nil {
		return fmt.Errorf("an insert outside the transaction has a txnNumber: %v", events[2])
	}
	return nil
}

func abortedTransactionLeavesNothing(ctx context.Context, db *mongo.Database, _ string) error {
	coll := db.Collection("c")
	if _, err := coll.InsertOne(ctx, bson.D{{"_id", int32(0)}}); err != nil {
		return err
	}
	stream, sess, err := watchInSession(ctx, db, coll)
	if err != nil {
		return err
	}
	defer stream.Close(ctx)
	defer sess.EndSession(ctx)
	err = mongo.WithSession(ctx, sess, func(sc mongo.SessionContext) error {
		if err := sess.StartTransaction(); err != nil {
			return err
		}
		if _, err := coll.InsertOne(sc, bson.D{{"_id", int32(1)}}); err != nil {
			return err
		}
		if _, err := coll.InsertOne(sc, bson.D{{"_id", int32(2)}}); err != nil {
			return err
		}
		return sess.AbortTransaction(sc)
	})
	if err != nil {
		return err
	}
	if _, err := coll.InsertOne(ctx, bson.D{{"_id", int32(3)}}); err != nil {
		return err
	}
	ev, err := nextEvent(stream)
	if err != nil {
		return err
	}
	if err := expectEvent(ev, "insert", 3); err != nil {
		return fmt.Errorf("an aborted transaction showed: %w", err)
	}
	n, err := coll.CountDocuments(ctx, bson.D{})
	if err != nil {
		return err
	}
	if n != 2 {
		return fmt.Errorf("%d documents after the abort, want 2 (_id 0 and 3)", n)
	}
	return nil
}

// Driver 1.8.4 has neither the createCollection option nor fullDocumentBeforeChange (both came
// in 1.10), so this check sends the create command and the $changeStream aggregate itself.
func updateEventCarriesThePreImage(ctx context.Context, db *mongo.Database, _ string) error {
	create := bson.D{{"create", "c"}, {"changeStreamPreAndPostImages", bson.D{{"enabled", true}}}}
	if err := db.RunCommand(ctx, create).Err(); err != nil {
		return err
	}
	coll := db.Collection("c")
	before := bson.D{{"_id", int32(1)}, {"a", int32(1)}, {"b", "x"}}
	if _, err := coll.InsertOne(ctx, before); err != nil {
		return err
	}
	aggregate := bson.D{
		{"aggregate", "c"},
		{"pipeline", bson.A{bson.D{{"$changeStream", bson.D{{"fullDocumentBeforeChange", "required"}}}}}},
		{"cursor", bson.D{}},
	}
	stream, err := db.RunCommandCursor(ctx, aggregate)
	if err != nil {
		return err
	}
	defer stream.Close(ctx)
	if _, err := coll.UpdateOne(ctx, bson.D{{"_id", int32(1)}}, bson.D{{"$set", bson.D{{"a", int32(2)}}}}); err != nil {
		return err
	}
	ev, err := nextEvent(stream)
	if err != nil {
		return err
	}
	if err := expectEvent(ev, "update", 1); err != nil {
		return err
	}
	if err := sameDoc(ev.Lookup("fullDocumentBeforeChange"), before); err != nil {
		return fmt.Errorf("fullDocumentBeforeChange: %w", err)
	}
	return nil
}

// runCheck runs one check on a fresh database and drops it afterwards.
func runCheck(client *mongo.Client, uri string, c check) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*wait)
	defer cancel()
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	db := client.Database("gointerop_" + hex.EncodeToString(suffix))
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
		if dropErr := db.Drop(ctx); err == nil && dropErr != nil {
			err = fmt.Errorf("dropping %s: %w", db.Name(), dropErr)
		}
	}()
	return c.run(ctx, db, uri)
}

func main() {
	uri := "mongodb://127.0.0.1:27017/"
	if len(os.Args) > 1 {
		uri = os.Args[1]
	}
	const label = "Go driver (mongo-go-driver 1.8.4)"
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	client, err := mongo.Connect(ctx, options.Client().ApplyURI(uri).SetServerSelectionTimeout(10*time.Second))
	if err == nil {
		err = client.Ping(ctx, nil)
	}
	if err != nil {
		fmt.Printf("FAIL  setup: %v\n0 passed, 1 failed: %s\n", err, label)
		os.Exit(1)
	}
	passed, failed := 0, 0
	for _, c := range checks {
		if err := runCheck(client, uri, c); err != nil {
			failed++
			fmt.Printf("FAIL  %s: %v\n", c.name, err)
		} else {
			passed++
			fmt.Printf("ok    %s\n", c.name)
		}
	}
	if err := client.Disconnect(context.Background()); err != nil && !errors.Is(err, mongo.ErrClientDisconnected) {
		fmt.Printf("disconnecting: %v\n", err)
	}
	fmt.Printf("%d passed, %d failed: %s\n", passed, failed, label)
	if failed > 0 {
		os.Exit(1)
	}
}
