// Mongoose (models over the Node.js driver) against a live Tributary server.
//
// Usage: node tests/js/mongoose.js mongodb://127.0.0.1:PORT/
//
// Writes through a model (create, updateOne, deleteOne) and reads back with find; watches the
// model with Model.watch() and sees insert, update and delete; resumes the same change stream on
// its own after a second connection finds its server-side cursor with
// `currentOp {idleCursors: true}` and kills it (no event lost, none repeated); commits a
// two-document connection.transaction() (both visible, both events with the session's lsid and
// one txnNumber) and aborts another (nothing left, no event); reads an update's pre-image from a
// collection created with changeStreamPreAndPostImages. Each check runs on its own database; the
// last line is "N passed, N failed"; the exit status is non-zero if any check failed.
'use strict';

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const mongoose = require('mongoose');
const { runChecks, summary, exitWith } = require('./support/checks');

const { Long } = mongoose.mongo;
const WAIT_MS = 15000;

function deadline(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing within ${WAIT_MS} ms`)), WAIT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function nextEvent(stream) {
  return deadline(stream.next(), 'change event');
}

/**
 * Opens the stream on the server now. Model.watch() returns at once and the driver runs the
 * aggregate only on the first read; Mongoose's ChangeStream has next() and hasNext(), which
 * wait for an event, but no tryNext(), so the first read goes through the driver stream it wraps
 * (as tests/js/change_streams.js opens its streams). Later reads use Mongoose's next().
 */
async function opened(stream) {
  const until = Date.now() + WAIT_MS;
  while (stream.driverChangeStream == null) {
    if (Date.now() > until) throw new Error(`Model.watch() not ready within ${WAIT_MS} ms`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  assert.equal(await deadline(stream.driverChangeStream.tryNext(), 'opening the stream'), null);
  return stream;
}

const itemSchema = new mongoose.Schema({ _id: String, name: String, qty: Number });

/**
 * A fresh database (random name) on the shared connection, with an Item model on it whose
 * collection exists: waiting for Model.init() (autoCreate) here keeps its createCollection from
 * racing the check's first write or recreating the database after the check drops it.
 */
async function freshDb(conn, schema = itemSchema) {
  const db = conn.useDb('jsmg_' + crypto.randomBytes(4).toString('hex'), { useCache: false });
  const Item = db.model('Item', schema, 'items');
  await deadline(Item.init(), 'Model.init()');
  return { db, Item };
}

/** The ids of the idle cursors on `ns` ("db.coll") that currentOp reports. */
async function idleCursorIds(conn, ns) {
  const reply = await conn.db.admin().command({ currentOp: 1, idleCursors: true });
  return reply.inprog
    .filter((op) => op.type === 'idleCursor' && op.ns === ns)
    .map((op) => op.cursor.cursorId);
}

async function modelWritesAreReadBack(conn) {
  const { db, Item } = await freshDb(conn);
  try {
    const apple = await Item.create({ _id: 'apple', name: 'apple', qty: 1 });
    assert.equal(apple.isNew, false);
    await Item.create([
      { _id: 'pear', name: 'pear', qty: 2 },
      { _id: 'plum', name: 'plum', qty: 3 },
    ]);
    const upd = await Item.updateOne({ _id: 'apple' }, { $inc: { qty: 10 } });
    assert.equal(upd.matchedCount, 1);
    assert.equal(upd.modifiedCount, 1);
    const del = await Item.deleteOne({ _id: 'pear' });
    assert.equal(del.deletedCount, 1);
    const docs = await Item.find().sort({ _id: 1 }).lean();
    assert.deepEqual(docs, [
      { _id: 'apple', name: 'apple', qty: 11, __v: 0 },
      { _id: 'plum', name: 'plum', qty: 3, __v: 0 },
    ]);
    const found = await Item.findById('apple');
    assert.equal(found.qty, 11);
    assert.equal(await Item.countDocuments(), 2);
  } finally {
    await db.dropDatabase();
  }
}

async function modelWatchSeesInsertUpdateDelete(conn) {
  const { db, Item } = await freshDb(conn);
  await Item.create({ _id: 'seed' });
  const stream = await opened(Item.watch([], { maxAwaitTimeMS: 200 }));
  try {
    await Item.create({ _id: 'a', name: 'apple', qty: 1 });
    await Item.updateOne({ _id: 'a' }, { $set: { qty: 2 } });
    await Item.deleteOne({ _id: 'a' });
    const ins = await nextEvent(stream);
    assert.equal(ins.operationType, 'insert');
    assert.deepEqual(ins.documentKey, { _id: 'a' });
    assert.deepEqual(ins.fullDocument, { _id: 'a', name: 'apple', qty: 1, __v: 0 });
    assert.deepEqual(ins.ns, { db: db.name, coll: 'items' });
    const upd = await nextEvent(stream);
    assert.equal(upd.operationType, 'update');
    assert.deepEqual(upd.documentKey, { _id: 'a' });
    assert.deepEqual(upd.updateDescription.updatedFields, { qty: 2 });
    const del = await nextEvent(stream);
    assert.equal(del.operationType, 'delete');
    assert.deepEqual(del.documentKey, { _id: 'a' });
  } finally {
    await stream.close();
    await db.dropDatabase();
  }
}

async function streamResumesAfterAnotherClientKillsItsCursor(conn, uri) {
  const { db, Item } = await freshDb(conn);
  const ns = `${db.name}.items`;
  await Item.create({ _id: 'seed' });
  const other = await mongoose
    .createConnection(uri, { serverSelectionTimeoutMS: 10000 })
    .asPromise();
  const stream = await opened(Item.watch([], { maxAwaitTimeMS: 200 }));
  try {
    await Item.create({ _id: 'one' });
    assert.deepEqual((await nextEvent(stream)).documentKey, { _id: 'one' });
    // Written before the kill and not yet read: the resumed stream must still see it.
    await Item.create({ _id: 'two' });
    const ids = await idleCursorIds(other, ns);
    assert.equal(ids.length, 1, `idle cursors on ${ns}: ${ids}`);
    // A cursor id is an int64: send it back as one even if it came back as a small number.
    const killed = typeof ids[0] === 'number' ? Long.fromNumber(ids[0]) : ids[0];
    const reply = await other.client
      .db(db.name)
      .command({ killCursors: 'items', cursors: [killed] });
    assert.deepEqual(reply.cursorsKilled.map(String), [String(killed)], JSON.stringify(reply));
    await Item.create({ _id: 'three' });
    // The next getMore fails with CursorNotFound: the driver resumes transparently.
    const got = [];
    for (let i = 0; i < 2; i += 1) got.push((await nextEvent(stream)).documentKey._id);
    assert.deepEqual(got, ['two', 'three']);
    // No duplicate: the event after 'three' is the marker written now.
    await Item.create({ _id: 'marker' });
    assert.deepEqual((await nextEvent(stream)).documentKey, { _id: 'marker' });
    const after = await idleCursorIds(other, ns);
    assert.ok(
      after.length === 1 && String(after[0]) !== String(killed),
      `after the resume: ${after}`,
    );
  } finally {
    await stream.close();
    await other.close();
    await db.dropDatabase();
  }
}

async function committedTransactionShowsBothInsertsWithOneLsidAndTxnNumber(conn) {
  const { db, Item } = await freshDb(conn);
  const stream = await opened(Item.watch([], { maxAwaitTimeMS: 200 }));
  try {
    let lsid;
    await db.transaction(async (session) => {
      lsid = session.id;
      await Item.create(
        [
          { _id: 'o1', qty: 1 },
          { _id: 'o2', qty: 2 },
        ],
        { session, ordered: true },
      );
    });
    const docs = await Item.find({ _id: { $in: ['o1', 'o2'] } }).sort({ _id: 1 }).lean();
    assert.deepEqual(docs.map((d) => [d._id, d.qty]), [['o1', 1], ['o2', 2]]);
    await Item.create({ _id: 'after' });
    const events = [];
    for (let i = 0; i < 3; i += 1) events.push(await nextEvent(stream));
    assert.deepEqual(
      events.map((e) => [e.operationType, e.documentKey._id]),
      [['insert', 'o1'], ['insert', 'o2'], ['insert', 'after']],
    );
    const [a, b] = events;
    assert.ok(a.lsid && a.lsid.id.buffer.equals(lsid.id.buffer), 'the session lsid');
    assert.ok(b.lsid && b.lsid.id.buffer.equals(lsid.id.buffer), 'one lsid for both');
    assert.notEqual(a.txnNumber, undefined, 'a txnNumber');
    assert.equal(String(a.txnNumber), String(b.txnNumber));
    assert.ok(a.clusterTime.equals(b.clusterTime), 'one commit time');
  } finally {
    await stream.close();
    await db.dropDatabase();
  }
}

async function abortedTransactionLeavesNothing(conn) {
  const { db, Item } = await freshDb(conn);
  await Item.create({ _id: 'seed' });
  const stream = await opened(Item.watch([], { maxAwaitTimeMS: 200 }));
  try {
    const abort = new Error('abort on purpose');
    await assert.rejects(
      db.transaction(async (session) => {
        await Item.create([{ _id: 'never1' }, { _id: 'never2' }], { session, ordered: true });
        assert.equal(await Item.countDocuments().session(session), 3);
        throw abort;
      }),
      (e) => e === abort,
    );
    await Item.create({ _id: 'marker' });
    const ev = await nextEvent(stream);
    assert.deepEqual(ev.documentKey, { _id: 'marker' }, 'an aborted transaction showed');
    const ids = (await Item.find().sort({ _id: 1 }).lean()).map((d) => d._id);
    assert.deepEqual(ids, ['marker', 'seed']);
  } finally {
    await stream.close();
    await db.dropDatabase();
  }
}

async function updateEventCarriesItsPreImage(conn) {
  const schema = new mongoose.Schema(
    { _id: Number, name: String, qty: Number },
    { collectionOptions: { changeStreamPreAndPostImages: { enabled: true } } },
  );
  const { db, Item } = await freshDb(conn, schema);
  try {
    const [info] = await db.db.listCollections({ name: 'items' }).toArray();
    assert.deepEqual(info.options.changeStreamPreAndPostImages, { enabled: true });
    await Item.create({ _id: 1, name: 'widget', qty: 5 });
    const before = await Item.findById(1).lean();
    const stream = await opened(
      Item.watch([], { fullDocumentBeforeChange: 'required', maxAwaitTimeMS: 200 }),
    );
    try {
      await Item.updateOne({ _id: 1 }, { $set: { qty: 6 }, $unset: { name: 1 } });
      const ev = await nextEvent(stream);
      assert.equal(ev.operationType, 'update');
      assert.deepEqual(ev.fullDocumentBeforeChange, before);
      assert.deepEqual(before, { _id: 1, name: 'widget', qty: 5, __v: 0 });
    } finally {
      await stream.close();
    }
  } finally {
    await db.dropDatabase();
  }
}

async function main(uri) {
  const conn = await mongoose
    .createConnection(uri, { serverSelectionTimeoutMS: 10000 })
    .asPromise();
  const result = await runChecks(
    [
      modelWritesAreReadBack,
      modelWatchSeesInsertUpdateDelete,
      streamResumesAfterAnotherClientKillsItsCursor,
      committedTransactionShowsBothInsertsWithOneLsidAndTxnNumber,
      abortedTransactionLeavesNothing,
      updateEventCarriesItsPreImage,
    ],
    [conn, uri],
  );
  await conn.close();
  return summary(result, `Mongoose ${mongoose.version}`);
}

exitWith(main, 'Mongoose');
