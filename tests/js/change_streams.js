// Node.js driver change-stream interop against a live Tributary server started with
// --enableTestCommands.
//
// Usage: node tests/js/change_streams.js mongodb://127.0.0.1:PORT/
//
// Watches a collection, a database and the cluster; sees every event type; resumes on its own
// after a `closeConnection` fail point drops the getMore's connection; restarts with startAfter
// from an invalidate after a drop. The last line is "N passed, N failed"; the exit status is
// non-zero if any check failed.
'use strict';

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { MongoClient } = require('mongodb');
const { runChecks, summary, exitWith } = require('./support/checks');

const LABEL = 'Node.js driver change streams';

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
  return client.db('jscs_' + crypto.randomBytes(4).toString('hex'));
}

async function collectionEvents(client) {
  const db = freshDb(client);
  const coll = db.collection('c');
  await coll.insertOne({ _id: 0 });
  const stream = await opened(coll.watch([], { fullDocument: 'updateLookup', maxAwaitTimeMS: 200 }));
  try {
    await coll.insertOne({ _id: 1, a: 1 });
    await coll.updateOne({ _id: 1 }, { $set: { a: 2 } });
    await coll.replaceOne({ _id: 1 }, { b: 1 });
    await coll.deleteOne({ _id: 1 });
    await coll.drop();
    const ins = await nextEvent(stream);
    assert.equal(ins.operationType, 'insert');
    assert.deepEqual(ins.fullDocument, { _id: 1, a: 1 });
    assert.deepEqual(ins.ns, { db: db.databaseName, coll: 'c' });
    assert.deepEqual(ins.documentKey, { _id: 1 });
    assert.ok(ins.clusterTime && ins.wallTime, 'clusterTime and wallTime');
    const upd = await nextEvent(stream);
    assert.equal(upd.operationType, 'update');
    assert.deepEqual(upd.updateDescription.updatedFields, { a: 2 });
    const rep = await nextEvent(stream);
    assert.equal(rep.operationType, 'replace');
    assert.deepEqual(rep.fullDocument, { _id: 1, b: 1 });
    const del = await nextEvent(stream);
    assert.equal(del.operationType, 'delete');
    assert.equal((await nextEvent(stream)).operationType, 'drop');
    assert.equal((await nextEvent(stream)).operationType, 'invalidate');
  } finally {
    await stream.close();
  }
}

async function databaseAndClusterStreams(client) {
  const db = freshDb(client);
  const dbStream = await opened(db.watch([], { maxAwaitTimeMS: 200 }));
  const clusterStream = await opened(client.watch([], { maxAwaitTimeMS: 200 }));
  try {
    await db.collection('a').insertOne({ _id: 'a' });
    await db.collection('b').insertOne({ _id: 'b' });
    for (const stream of [dbStream, clusterStream]) {
      const got = [];
      while (got.length < 2) {
        const ev = await nextEvent(stream);
        if (ev.ns.db === db.databaseName) got.push(`${ev.operationType}:${ev.ns.coll}`);
      }
      assert.deepEqual(got, ['insert:a', 'insert:b']);
    }
  } finally {
    await dbStream.close();
    await clusterStream.close();
    await db.dropDatabase();
  }
}

async function resumeAfterClosedConnection(client, uri) {
  const started = [];
  const watcher = new MongoClient(uri, { monitorCommands: true, serverSelectionTimeoutMS: 10000 });
  watcher.on('commandStarted', (e) => started.push(e.commandName));
  const db = freshDb(client);
  const coll = db.collection('c');
  await coll.insertOne({ _id: 0 });
  const stream = await opened(watcher.db(db.databaseName).collection('c').watch([], { maxAwaitTimeMS: 200 }));
  try {
    await coll.insertOne({ _id: 1 });
    assert.deepEqual((await nextEvent(stream)).documentKey, { _id: 1 });
    await client.db('admin').command({
      configureFailPoint: 'failCommand',
      mode: { times: 1 },
      data: { failCommands: ['getMore'], closeConnection: true },
    });
    await coll.insertOne({ _id: 2 });
    assert.deepEqual((await nextEvent(stream)).documentKey, { _id: 2 });
    const aggregates = started.filter((n) => n === 'aggregate').length;
    assert.equal(aggregates, 2, `expected one resume, saw commands ${started.join(',')}`);
  } finally {
    await client.db('admin').command({ configureFailPoint: 'failCommand', mode: 'off' });
    await stream.close();
    await watcher.close();
    await db.dropDatabase();
  }
}

async function startAfterDrop(client) {
  const db = freshDb(client);
  const coll = db.collection('c');
  await coll.insertOne({ _id: 0 });
  const first = await opened(coll.watch([], { maxAwaitTimeMS: 200 }));
  let token;
  try {
    await coll.drop();
    assert.equal((await nextEvent(first)).operationType, 'drop');
    const inv = await nextEvent(first);
    assert.equal(inv.operationType, 'invalidate');
    token = inv._id;
  } finally {
    await first.close();
  }
  await coll.insertOne({ _id: 'again' });
  // The insert is already past the token: the first read returns it.
  const second = coll.watch([], { startAfter: token, maxAwaitTimeMS: 200 });
  try {
    const ev = await nextEvent(second);
    assert.equal(ev.operationType, 'insert');
    assert.deepEqual(ev.documentKey, { _id: 'again' });
  } finally {
    await second.close();
    await db.dropDatabase();
  }
}

async function main(uri) {
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 10000 });
  await client.connect();
  const params = await client.db('admin').command({ getParameter: '*' });
  const checks = [collectionEvents, databaseAndClusterStreams, startAfterDrop];
  if (params.enableTestCommands) {
    checks.push(resumeAfterClosedConnection);
  } else {
    console.log('FAIL  resumeAfterClosedConnection: the server runs without --enableTestCommands');
  }
  const result = await runChecks(checks, [client, uri], params.enableTestCommands ? 0 : 1);
  await client.close();
  return summary(result, LABEL);
}

exitWith(main, LABEL);
