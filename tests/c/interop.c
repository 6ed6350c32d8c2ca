/* C driver (libmongoc 1.23, Debian's libmongoc-dev) interop against a live Tributary server.
 *
 * Usage:
 *   gcc -Wall -Wextra -Werror -o /tmp/c-interop tests/c/interop.c \
 *       $(pkg-config --cflags --libs libmongoc-1.0)
 *   /tmp/c-interop mongodb://127.0.0.1:PORT/
 *
 * On a fresh database each: inserts, updates and deletes read back; a change stream sees insert,
 * update and delete events; the same stream resumes with no gap and no duplicate after a second
 * client finds its cursor with currentOp (idleCursors) and kills it; a transaction committed
 * with mongoc_client_session_with_transaction shows both inserts, with one lsid and txnNumber,
 * and an aborted transaction leaves nothing; an update on a collection created with
 * changeStreamPreAndPostImages carries fullDocumentBeforeChange. The last line is
 * "N passed, N failed"; the exit status is non-zero if any check failed.
 */
#include <mongoc/mongoc.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_S 15

/* What a check gets: a fresh database (dropped afterwards), its collection "c", and the URI for
 * a second client. A failing check writes why into `why`. */
struct fixture {
   const char *uri;
   mongoc_client_t *client;
   mongoc_database_t *db;
   mongoc_collection_t *coll;
   char db_name[32];
   char why[2048];
};

/* Fails the check (jumping to its `done:` cleanup) unless cond holds. */
#define EXPECT(cond, ...)                                      \
   do {                                                        \
      if (!(cond)) {                                           \
         snprintf (f->why, sizeof f->why, __VA_ARGS__);        \
         goto done;                                            \
      }                                                        \
   } while (0)

/* Fails the check unless a helper that has already written `why` returned true. */
#define REQUIRE(call) \
   do {               \
      if (!(call)) {  \
         goto done;   \
      }               \
   } while (0)

static void
set_why_json (struct fixture *f, const char *what, const bson_t *doc)
{
   char *json = bson_as_canonical_extended_json (doc, NULL);
   snprintf (f->why, sizeof f->why, "%s: %s", what, json);
   bson_free (json);
}

/* A stream on the collection, opened on the server now (libmongoc runs the aggregate in watch). */
static mongoc_change_stream_t *
open_stream (struct fixture *f, const bson_t *opts)
{
   bson_t pipeline = BSON_INITIALIZER;
   bson_error_t error;
   const bson_t *reply;
   mongoc_change_stream_t *stream = mongoc_collection_watch (f->coll, &pipeline, opts);
   bson_destroy (&pipeline);
   if (mongoc_change_stream_error_document (stream, &error, &reply)) {
      snprintf (f->why, sizeof f->why, "watch failed: %s", error.message);
      mongoc_change_stream_destroy (stream);
      return NULL;
   }
   return stream;
}

/* The next event (a copy for the caller to destroy), waiting at most WAIT_S seconds. */
static bson_t *
next_event (struct fixture *f, mongoc_change_stream_t *stream)
{
   const int64_t deadline = bson_get_monotonic_time () + WAIT_S * 1000000;
   const bson_t *ev;
   const bson_t *reply;
   bson_error_t error;
   while (bson_get_monotonic_time () < deadline) {
      if (mongoc_change_stream_next (stream, &ev)) {
         return bson_copy (ev);
      }
      if (mongoc_change_stream_error_document (stream, &error, &reply)) {
         snprintf (f->why, sizeof f->why, "the change stream failed: %s", error.message);
         return NULL;
      }
   }
   snprintf (f->why, sizeof f->why, "no change event within %d s", WAIT_S);
   return NULL;
}

/* An event's operationType and documentKey._id (an int32). */
static bool
expect_event (struct fixture *f, const bson_t *ev, const char *op, int32_t id)
{
   bson_iter_t it;
   bool op_ok = bson_iter_init_find (&it, ev, "operationType") && BSON_ITER_HOLDS_UTF8 (&it) &&
                strcmp (bson_iter_utf8 (&it, NULL), op) == 0;
   bool id_ok = bson_iter_init (&it, ev) && bson_iter_find_descendant (&it, "documentKey._id", &it) &&
                BSON_ITER_HOLDS_INT32 (&it) && bson_iter_int32 (&it) == id;
   if (!op_ok || !id_ok) {
      char what[128];
      snprintf (what, sizeof what, "want operationType \"%s\" and documentKey {_id: %d}, got", op, id);
      set_why_json (f, what, ev);
      return false;
   }
   return true;
}

/* got is byte for byte want (same fields, order and types); `what` names it in `why`. */
static bool
same_bson (struct fixture *f, const char *what, const bson_t *got, const bson_t *want)
{
   if (bson_equal (got, want)) {
      return true;
   }
   char *got_json = bson_as_canonical_extended_json (got, NULL);
   char *want_json = bson_as_canonical_extended_json (want, NULL);
   snprintf (f->why, sizeof f->why, "%s: got %s, want %s", what, got_json, want_json);
   bson_free (got_json);
   bson_free (want_json);
   return false;
}

/* The document at `path` in doc is byte for byte `want`. */
static bool
same_doc (struct fixture *f, const bson_t *doc, const char *path, const bson_t *want)
{
   bson_iter_t it;
   const uint8_t *data;
   uint32_t len;
   bson_t got;
   if (!bson_iter_init (&it, doc) || !bson_iter_find_descendant (&it, path, &it) ||
       !BSON_ITER_HOLDS_DOCUMENT (&it)) {
      char what[128];
      snprintf (what, sizeof what, "no document at %s in", path);
      set_why_json (f, what, doc);
      return false;
   }
   bson_iter_document (&it, &len, &data);
   return bson_init_static (&got, data, len) && same_bson (f, path, &got, want);
}

static bool
insert_id (struct fixture *f, mongoc_collection_t *coll, int32_t id, const bson_t *opts)
{
   bson_error_t error;
   bson_t *doc = BCON_NEW ("_id", BCON_INT32 (id));
   bool ok = mongoc_collection_insert_one (coll, doc, opts, NULL, &error);
   bson_destroy (doc);
   if (!ok) {
      snprintf (f->why, sizeof f->why, "inserting {_id: %d}: %s", id, error.message);
   }
   return ok;
}

static bool
writes_read_back (struct fixture *f)
{
   bool ok = false;
   bson_error_t error;
   bson_t reply = BSON_INITIALIZER;
   bson_t *a = BCON_NEW ("_id", BCON_INT32 (1), "name", "a", "n", BCON_INT32 (1));
   bson_t *b = BCON_NEW ("_id", BCON_INT32 (2), "name", "b", "n", BCON_INT32 (1));
   bson_t *id1 = BCON_NEW ("_id", BCON_INT32 (1));
   bson_t *id2 = BCON_NEW ("_id", BCON_INT32 (2));
   bson_t *set = BCON_NEW ("$set", "{", "n", BCON_INT32 (2), "}");
   bson_t *want = BCON_NEW ("_id", BCON_INT32 (1), "name", "a", "n", BCON_INT32 (2));
   bson_t *all = bson_new ();
   bson_t *sorted = BCON_NEW ("sort", "{", "_id", BCON_INT32 (1), "}");
   mongoc_cursor_t *cursor = NULL;
   const bson_t *doc;
   int found = 0;

   EXPECT (mongoc_collection_insert_one (f->coll, a, NULL, NULL, &error), "insert: %s", error.message);
   EXPECT (mongoc_collection_insert_one (f->coll, b, NULL, NULL, &error), "insert: %s", error.message);
   bson_reinit (&reply);
   EXPECT (mongoc_collection_update_one (f->coll, id1, set, NULL, &reply, &error), "update: %s", error.message);
   bson_iter_t it;
   EXPECT (bson_iter_init_find (&it, &reply, "modifiedCount") && bson_iter_as_int64 (&it) == 1,
           "updateOne did not modify one document");
   bson_reinit (&reply);
   EXPECT (mongoc_collection_delete_one (f->coll, id2, NULL, &reply, &error), "delete: %s", error.message);
   EXPECT (bson_iter_init_find (&it, &reply, "deletedCount") && bson_iter_as_int64 (&it) == 1,
           "deleteOne did not delete one document");
   cursor = mongoc_collection_find_with_opts (f->coll, all, sorted, NULL);
   while (mongoc_cursor_next (cursor, &doc)) {
      found++;
      REQUIRE (same_bson (f, "read back", doc, want));
   }
   EXPECT (!mongoc_cursor_error (cursor, &error), "find: %s", error.message);
   EXPECT (found == 1, "read back %d documents, want 1", found);
   ok = true;
done:
   mongoc_cursor_destroy (cursor);
   bson_destroy (&reply);
   bson_destroy (a);
   bson_destroy (b);
   bson_destroy (id1);
   bson_destroy (id2);
   bson_destroy (set);
   bson_destroy (want);
   bson_destroy (all);
   bson_destroy (sorted);
   return ok;
}

static bool
watch_sees_insert_update_delete (struct fixture *f)
{
   bool ok = false;
   bson_error_t error;
   bson_t *opts = BCON_NEW ("maxAwaitTimeMS", BCON_INT32 (200));
   bson_t *inserted = BCON_NEW ("_id", BCON_INT32 (1), "a", BCON_INT32 (1));
   bson_t *id1 = BCON_NEW ("_id", BCON_INT32 (1));
   bson_t *set = BCON_NEW ("$set", "{", "a", BCON_INT32 (2), "}");
   bson_t *updated_fields = BCON_NEW ("a", BCON_INT32 (2));
   bson_t *ins = NULL, *upd = NULL, *del = NULL;
   mongoc_change_stream_t *stream = open_stream (f, opts);
   REQUIRE (stream);

   EXPECT (mongoc_collection_insert_one (f->coll, inserted, NULL, NULL, &error), "insert: %s", error.message);
   EXPECT (mongoc_collection_update_one (f->coll, id1, set, NULL, NULL, &error), "update: %s", error.message);
   EXPECT (mongoc_collection_delete_one (f->coll, id1, NULL, NULL, &error), "delete: %s", error.message);
   REQUIRE ((ins = next_event (f, stream)));
   REQUIRE (expect_event (f, ins, "insert", 1));
   REQUIRE (same_doc (f, ins, "fullDocument", inserted));
   REQUIRE ((upd = next_event (f, stream)));
   REQUIRE (expect_event (f, upd, "update", 1));
   REQUIRE (same_doc (f, upd, "updateDescription.updatedFields", updated_fields));
   REQUIRE ((del = next_event (f, stream)));
   REQUIRE (expect_event (f, del, "delete", 1));
   ok = true;
done:
   mongoc_change_stream_destroy (stream);
   bson_destroy (opts);
   bson_destroy (inserted);
   bson_destroy (id1);
   bson_destroy (set);
   bson_destroy (updated_fields);
   bson_destroy (ins);
   bson_destroy (upd);
   bson_destroy (del);
   return ok;
}

/* The cursor ids currentOp (idleCursors: true) shows for the fixture's collection; -1 if
 * currentOp failed. */
static int
idle_cursor_ids (struct fixture *f, mongoc_client_t *client, int64_t *ids, int max)
{
   char ns[64];
   bson_t *cmd = BCON_NEW ("currentOp", BCON_INT32 (1), "idleCursors", BCON_BOOL (true));
   bson_t reply;
   bson_error_t error;
   bson_iter_t inprog, op, field;
   int n = 0;
   snprintf (ns, sizeof ns, "%s.c", f->db_name);
   if (!mongoc_client_command_simple (client, "admin", cmd, NULL, &reply, &error)) {
      snprintf (f->why, sizeof f->why, "currentOp: %s", error.message);
      n = -1;
   } else if (bson_iter_init_find (&inprog, &reply, "inprog") && bson_iter_recurse (&inprog, &op)) {
      while (bson_iter_next (&op) && n < max) {
         bson_t entry;
         const uint8_t *data;
         uint32_t len;
         if (!BSON_ITER_HOLDS_DOCUMENT (&op)) {
            continue;
         }
         bson_iter_document (&op, &len, &data);
         bson_init_static (&entry, data, len);
         bool idle = bson_iter_init_find (&field, &entry, "type") && BSON_ITER_HOLDS_UTF8 (&field) &&
                     strcmp (bson_iter_utf8 (&field, NULL), "idleCursor") == 0;
         bool ours = bson_iter_init_find (&field, &entry, "ns") && BSON_ITER_HOLDS_UTF8 (&field) &&
                     strcmp (bson_iter_utf8 (&field, NULL), ns) == 0;
         if (idle && ours && bson_iter_init (&field, &entry) &&
             bson_iter_find_descendant (&field, "cursor.cursorId", &field)) {
            ids[n++] = bson_iter_as_int64 (&field);
         }
      }
   }
   bson_destroy (&reply);
   bson_destroy (cmd);
   return n;
}

static bool
stream_resumes_after_its_cursor_is_killed (struct fixture *f)
{
   bool ok = false;
   bson_error_t error;
   bson_t *opts = BCON_NEW ("maxAwaitTimeMS", BCON_INT32 (200));
   bson_t *kill = NULL;
   bson_t killed = BSON_INITIALIZER;
   bson_t *ev = NULL;
   int64_t ids[4];
   int n;
   bson_iter_t it;
   mongoc_client_t *other = mongoc_client_new (f->uri);
   mongoc_client_set_error_api (other, MONGOC_ERROR_API_VERSION_2);
   mongoc_database_t *other_db = mongoc_client_get_database (other, f->db_name);
   mongoc_change_stream_t *stream = open_stream (f, opts);
   REQUIRE (stream);

   REQUIRE (insert_id (f, f->coll, 1, NULL));
   REQUIRE ((ev = next_event (f, stream)));
   REQUIRE (expect_event (f, ev, "insert", 1));

   /* A second client finds the stream's cursor on the server and kills it. */
   REQUIRE ((n = idle_cursor_ids (f, other, ids, 4)) >= 0);
   EXPECT (n == 1, "currentOp shows %d idle cursors on %s.c, want 1 (the stream's)", n, f->db_name);
   kill = BCON_NEW ("killCursors", "c", "cursors", "[", BCON_INT64 (ids[0]), "]");
   bson_destroy (&killed);
   EXPECT (mongoc_database_command_simple (other_db, kill, NULL, &killed, &error), "killCursors: %s",
           error.message);
   if (!(bson_iter_init (&it, &killed) && bson_iter_find_descendant (&it, "cursorsKilled.0", &it) &&
         bson_iter_as_int64 (&it) == ids[0])) {
      set_why_json (f, "killCursors replied", &killed);
      goto done;
   }

   /* The next getMore fails with CursorNotFound; the driver resumes after event 1. */
   REQUIRE (insert_id (f, f->coll, 2, NULL));
   REQUIRE (insert_id (f, f->coll, 3, NULL));
   for (int32_t id = 2; id <= 3; id++) {
      bson_destroy (ev);
      REQUIRE ((ev = next_event (f, stream)));
      REQUIRE (expect_event (f, ev, "insert", id));
   }
   int64_t after[4];
   REQUIRE ((n = idle_cursor_ids (f, other, after, 4)) >= 0);
   EXPECT (n == 1 && after[0] != ids[0], "after the resume currentOp shows %d idle cursors on %s.c "
           "(the killed one was %lld), want one new cursor", n, f->db_name, (long long) ids[0]);
   ok = true;
done:
   mongoc_change_stream_destroy (stream);
   mongoc_database_destroy (other_db);
   mongoc_client_destroy (other);
   bson_destroy (opts);
   bson_destroy (kill);
   bson_destroy (&killed);
   bson_destroy (ev);
   return ok;
}

/* The body of the transaction: inserts _id 1 and 2 in the session. */
static bool
insert_two (mongoc_client_session_t *session, void *ctx, bson_t **reply, bson_error_t *error)
{
   (void) reply;
   mongoc_collection_t *coll = ctx;
   bson_t opts = BSON_INITIALIZER;
   bool ok = mongoc_client_session_append (session, &opts, error);
   for (int32_t id = 1; ok && id <= 2; id++) {
      bson_t *doc = BCON_NEW ("_id", BCON_INT32 (id));
      ok = mongoc_collection_insert_one (coll, doc, &opts, NULL, error);
      bson_destroy (doc);
   }
   bson_destroy (&opts);
   return ok;
}

/* The binary value at `path`, or false. */
static bool
binary_at (const bson_t *doc, const char *path, uint32_t *len, const uint8_t **data)
{
   bson_iter_t it;
   bson_subtype_t subtype;
   if (!bson_iter_init (&it, doc) || !bson_iter_find_descendant (&it, path, &it) ||
       !BSON_ITER_HOLDS_BINARY (&it)) {
      return false;
   }
   bson_iter_binary (&it, &subtype, len, data);
   return true;
}

static bool
transaction_commits_both_with_one_lsid (struct fixture *f)
{
   bool ok = false;
   bson_error_t error;
   bson_t *opts = BCON_NEW ("maxAwaitTimeMS", BCON_INT32 (200));
   bson_t *filter = BCON_NEW ("_id", "{", "$in", "[", BCON_INT32 (1), BCON_INT32 (2), "]", "}");
   bson_t reply = BSON_INITIALIZER;
   bson_t *events[3] = {NULL, NULL, NULL};
   mongoc_change_stream_t *stream = NULL;
   mongoc_client_session_t *session = NULL;
   mongoc_collection_t *created = mongoc_database_create_collection (f->db, "c", NULL, &error);
   EXPECT (created, "createCollection: %s", error.message);
   mongoc_collection_destroy (created);
   REQUIRE ((stream = open_stream (f, opts)));
   session = mongoc_client_start_session (f->client, NULL, &error);
   EXPECT (session, "startSession: %s", error.message);

   bson_destroy (&reply);
   EXPECT (mongoc_client_session_with_transaction (session, insert_two, NULL, f->coll, &reply, &error),
           "withTransaction: %s", error.message);
   REQUIRE (insert_id (f, f->coll, 3, NULL));
   int64_t visible = mongoc_collection_count_documents (f->coll, filter, NULL, NULL, NULL, &error);
   EXPECT (visible == 2, "%lld of the 2 committed documents visible (%s)", (long long) visible,
           visible < 0 ? error.message : "");
   for (int i = 0; i < 3; i++) {
      REQUIRE ((events[i] = next_event (f, stream)));
      REQUIRE (expect_event (f, events[i], "insert", i + 1));
   }

   uint32_t want_len, len;
   const uint8_t *want_id, *id;
   EXPECT (binary_at (mongoc_client_session_get_lsid (session), "id", &want_len, &want_id),
           "the session has no lsid.id");
   bson_iter_t txn0, txn1, it;
   for (int i = 0; i < 2; i++) {
      if (!binary_at (events[i], "lsid.id", &len, &id) || len != want_len || memcmp (id, want_id, len) != 0) {
         set_why_json (f, "want the session's lsid.id in", events[i]);
         goto done;
      }
   }
   if (!bson_iter_init_find (&txn0, events[0], "txnNumber") ||
       !bson_iter_init_find (&txn1, events[1], "txnNumber") ||
       bson_iter_as_int64 (&txn0) != bson_iter_as_int64 (&txn1)) {
      set_why_json (f, "want one txnNumber on both; the second event", events[1]);
      goto done;
   }
   if (bson_iter_init_find (&it, events[2], "txnNumber")) {
      set_why_json (f, "an insert outside the transaction has a txnNumber", events[2]);
      goto done;
   }
   ok = true;
done:
   mongoc_client_session_destroy (session);
   mongoc_change_stream_destroy (stream);
   for (int i = 0; i < 3; i++) {
      bson_destroy (events[i]);
   }
   bson_destroy (opts);
   bson_destroy (filter);
   bson_destroy (&reply);
   return ok;
}

static bool
aborted_transaction_leaves_nothing (struct fixture *f)
{
   bool ok = false;
   bson_error_t error;
   bson_t *opts = BCON_NEW ("maxAwaitTimeMS", BCON_INT32 (200));
   bson_t session_opts = BSON_INITIALIZER;
   bson_t *all = bson_new ();
   bson_t *ev = NULL;
   mongoc_change_stream_t *stream = NULL;
   mongoc_client_session_t *session = NULL;
   REQUIRE (insert_id (f, f->coll, 0, NULL));
   REQUIRE ((stream = open_stream (f, opts)));
   session = mongoc_client_start_session (f->client, NULL, &error);
   EXPECT (session, "startSession: %s", error.message);

   EXPECT (mongoc_client_session_start_transaction (session, NULL, &error), "startTransaction: %s",
           error.message);
   EXPECT (mongoc_client_session_append (session, &session_opts, &error), "%s", error.message);
   REQUIRE (insert_id (f, f->coll, 1, &session_opts));
   REQUIRE (insert_id (f, f->coll, 2, &session_opts));
   EXPECT (mongoc_client_session_abort_transaction (session, &error), "abortTransaction: %s",
           error.message);
   REQUIRE (insert_id (f, f->coll, 3, NULL));
   REQUIRE ((ev = next_event (f, stream)));
   REQUIRE (expect_event (f, ev, "insert", 3));
   int64_t n = mongoc_collection_count_documents (f->coll, all, NULL, NULL, NULL, &error);
   EXPECT (n == 2, "%lld documents after the abort, want 2 (_id 0 and 3)", (long long) n);
   ok = true;
done:
   mongoc_client_session_destroy (session);
   mongoc_change_stream_destroy (stream);
   bson_destroy (opts);
   bson_destroy (&session_opts);
   bson_destroy (all);
   bson_destroy (ev);
   return ok;
}

static bool
update_event_carries_the_pre_image (struct fixture *f)
{
   bool ok = false;
   bson_error_t error;
   bson_t *create = BCON_NEW ("changeStreamPreAndPostImages", "{", "enabled", BCON_BOOL (true), "}");
   bson_t *opts = BCON_NEW ("fullDocumentBeforeChange", "required", "maxAwaitTimeMS", BCON_INT32 (200));
   bson_t *before = BCON_NEW ("_id", BCON_INT32 (1), "a", BCON_INT32 (1), "b", "x");
   bson_t *id1 = BCON_NEW ("_id", BCON_INT32 (1));
   bson_t *set = BCON_NEW ("$set", "{", "a", BCON_INT32 (2), "}");
   bson_t *ev = NULL;
   mongoc_change_stream_t *stream = NULL;
   mongoc_collection_t *created = mongoc_database_create_collection (f->db, "c", create, &error);
   EXPECT (created, "createCollection with changeStreamPreAndPostImages: %s", error.message);
   mongoc_collection_destroy (created);

   EXPECT (mongoc_collection_insert_one (f->coll, before, NULL, NULL, &error), "insert: %s", error.message);
   REQUIRE ((stream = open_stream (f, opts)));
   EXPECT (mongoc_collection_update_one (f->coll, id1, set, NULL, NULL, &error), "update: %s", error.message);
   REQUIRE ((ev = next_event (f, stream)));
   REQUIRE (expect_event (f, ev, "update", 1));
   REQUIRE (same_doc (f, ev, "fullDocumentBeforeChange", before));
   ok = true;
done:
   mongoc_change_stream_destroy (stream);
   bson_destroy (create);
   bson_destroy (opts);
   bson_destroy (before);
   bson_destroy (id1);
   bson_destroy (set);
   bson_destroy (ev);
   return ok;
}

static const struct {
   const char *name;
   bool (*run) (struct fixture *);
} checks[] = {
   {"writes_read_back", writes_read_back},
   {"watch_sees_insert_update_delete", watch_sees_insert_update_delete},
   {"stream_resumes_after_its_cursor_is_killed", stream_resumes_after_its_cursor_is_killed},
   {"transaction_commits_both_with_one_lsid", transaction_commits_both_with_one_lsid},
   {"aborted_transaction_leaves_nothing", aborted_transaction_leaves_nothing},
   {"update_event_carries_the_pre_image", update_event_carries_the_pre_image},
};

int
main (int argc, char **argv)
{
   const char *label = "C driver (libmongoc 1.23)";
   const char *uri_string = argc > 1 ? argv[1] : "mongodb://127.0.0.1:27017/";
   bson_error_t error;
   int passed = 0, failed = 0;

   mongoc_init ();
   srand ((unsigned) time (NULL) ^ (unsigned) getpid ());
   mongoc_uri_t *uri = mongoc_uri_new_with_error (uri_string, &error);
   mongoc_client_t *client = uri ? mongoc_client_new_from_uri (uri) : NULL;
   bson_t *ping = BCON_NEW ("ping", BCON_INT32 (1));
   if (client) {
      mongoc_client_set_error_api (client, MONGOC_ERROR_API_VERSION_2);
   }
   if (!client || !mongoc_client_command_simple (client, "admin", ping, NULL, NULL, &error)) {
      printf ("FAIL  setup: %s\n0 passed, 1 failed: %s\n", error.message, label);
      return 1;
   }
   bson_destroy (ping);

   for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
      struct fixture f = {.uri = uri_string, .client = client};
      snprintf (f.db_name, sizeof f.db_name, "cinterop_%08x", (unsigned) rand ());
      f.db = mongoc_client_get_database (client, f.db_name);
      f.coll = mongoc_database_get_collection (f.db, "c");
      bool ok = checks[i].run (&f);
      if (ok && !mongoc_database_drop (f.db, &error)) {
         ok = false;
         snprintf (f.why, sizeof f.why, "dropping %s: %s", f.db_name, error.message);
      } else if (!ok) {
         mongoc_database_drop (f.db, NULL);
      }
      if (ok) {
         passed++;
         printf ("ok    %s\n", checks[i].name);
      } else {
         failed++;
         printf ("FAIL  %s: %s\n", checks[i].name, f.why);
      }
      fflush (stdout);
      mongoc_collection_destroy (f.coll);
      mongoc_database_destroy (f.db);
   }

   mongoc_client_destroy (client);
   mongoc_uri_destroy (uri);
   mongoc_cleanup ();
   printf ("%d passed, %d failed: %s\n", passed, failed, label);
   return failed ? 1 : 0;
}
