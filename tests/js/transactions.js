// Node.js driver multi-document transactions against a live Tributary server.
//
// Usage: node tests/js/transactions.js mongodb://127.0.0.1:PORT/
//
// Runs session.withTransaction (the convenient API) and watches the committed transaction
// arrive as one event per operation, each with the session's lsid and txnNumber; checks that
// an aborted transaction leaves nothing and shows no event. The last line is
// "N passed, N failed"; the exit status is non-zero if any check failed.
'use strict';

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { MongoClient } = require('mongodb');
const { runChecks, summary, exitWith } = require('./support/checks');

const LABEL = 'Node.js driver transactions';

const WAIT_MS = 15000;

async function nextEvent(stream) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no change event within ${WAIT_MS} ms`)), WAIT_MS);
  });
  try {
    return await Promise.race([stream.next(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Opens the stream on the server now (Node runs the aggregate lazily). */
async function opened(stream) {
  assert.equal(await stream.tryNext(), null);
  return stream;
}

function freshDb(client) {
  return client.db('jstxn_' + crypto.randomBytes(4).toString('hex'));
}

async function withTransactionAndItsEvents(client) {
  const db = freshDb(client);
  const coll = db.collection('orders');
  await coll.insertOne({ _id: 'stock', left: 5 });
  const stream = await opened(coll.watch([], { maxAwaitTimeMS: 200 }));
  const session = client.startSession();
  try {
    await session.withTransaction(async () => {
      await coll.updateOne({ _id: 'stock' }, { $inc: { left: -2 } }, { session });
      await coll.insertOne({ _id: 'order1', qty: 2 }, { session });
    });
    await coll.insertOne({ _id: 'after' });
    const events = [];
    for (let i = 0; i < 3; i += 1) events.push(await nextEvent(stream));
    assert.deepEqual(
      events.map((e) => [e.operationType, e.documentKey._id]),
      [['update', 'stock'], ['insert', 'order1'], ['insert', 'after']],
    );
    const [a, b] = events;
    assert.ok(a.clusterTime.equals(b.clusterTime), 'one commit time');
    assert.ok(a.lsid && a.lsid.id.buffer.equals(session.id.id.buffer), 'the session lsid');
    assert.equal(Number(a.txnNumber), Number(b.txnNumber));
    assert.equal(events[2].txnNumber, undefined);
    assert.equal((await coll.findOne({ _id: 'stock' })).left, 3);
  } finally {
    await session.endSession();
    await stream.close();
    await db.dropDatabase();
  }
}

async function abortLeavesNothing(client) {
  const db = freshDb(client);
  const coll = db.collection('c');
  await coll.insertOne({ _id: 0 });
  const stream = await opened(coll.watch([], { maxAwaitTimeMS: 200 }));
  const session = client.startSession();
  try {
    session.startTransaction();
    await coll.insertOne({ _id: 'never' }, { session });
    await coll.deleteOne({ _id: 0 }, { session });
    assert.equal(await coll.countDocuments({}, { session }), 1);
    await session.abortTransaction();
    await coll.insertOne({ _id: 'marker' });
    const ev = await nextEvent(stream);
    assert.deepEqual(ev.documentKey, { _id: 'marker' }, 'an aborted transaction showed');
    assert.equal(await coll.countDocuments({}), 2);
  } finally {
    await session.endSession();
    await stream.close();
    await db.dropDatabase();
  }
}

async function main(uri) {
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 10000 });
  await client.connect();
  const result = await runChecks([withTransactionAndItsEvents, abortLeavesNothing], [client]);
  await client.close();
  return summary(result, LABEL);
}

exitWith(main, LABEL);
