// Subscriptions through the Node.js driver and mongosh (`db.runCommand`), against a live
// Tributary router: create, read, ack, nack with a delay, list, selectors, a snapshot start
// and drop.
//
// Usage: node tests/js/subscriptions.js mongodb://127.0.0.1:PORT/
// The last line is "N passed, N failed"; the exit status is non-zero if any check failed.
'use strict';

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { MongoClient } = require('mongodb');

async function main(uri) {
  let passed = 0;
  let failed = 0;
  const check = async (name, fn) => {
    try {
      await fn();
      passed += 1;
      console.log(`ok   ${name}`);
    } catch (e) {
      failed += 1;
      console.log(`FAIL ${name}: ${e.stack || e}`);
    }
  };
  const client = new MongoClient(uri);
  await client.connect();
  const db = client.db(`subs_js_${crypto.randomBytes(4).toString('hex')}`);
  const read = (consumer, extra = {}) =>
    db.command({ readSubscription: 'orders', consumer, ...extra });

  await check('node: a consumer reads every change and acks it', async () => {
    await db.command({ createSubscription: 'orders', collection: 'o', ackTimeoutSecs: 5 });
    await db.collection('o').insertMany([{ _id: 1 }, { _id: 2 }]);
    const reply = await read('n', { max: 10, waitMS: 5000 });
    assert.deepEqual(reply.messages.map((m) => m.event.documentKey._id), [1, 2]);
    assert.equal(reply.messages[0].event.operationType, 'insert');
    const ack = await db.command({
      ackSubscription: 'orders', consumer: 'n',
      deliveryIds: reply.messages.map((m) => m.deliveryId),
    });
    assert.equal(Number(ack.acked), 2);
  });

  await check('node: a nack with retryInMS redelivers after the delay', async () => {
    await db.collection('o').insertOne({ _id: 3 });
    const first = await read('n', { waitMS: 5000 });
    assert.equal(first.messages.length, 1);
    await db.command({
      nackSubscription: 'orders', consumer: 'n',
      deliveryIds: [first.messages[0].deliveryId], retryInMS: 300,
    });
    const again = await read('n', { waitMS: 3000 });
    assert.equal(again.messages.length, 1);
    assert.equal(Number(again.messages[0].deliveryCount), 2);
  });

  await check('node: listSubscriptions has a row per consumer', async () => {
    const list = await db.command({ listSubscriptions: 1 });
    const rows = list.cursor.firstBatch;
    assert.equal(rows.length, 1);
    assert.equal(rows[0].consumer, 'n');
    assert.equal(Number(rows[0].acked), 2);
  });

  await check('mongosh: db.runCommand reads and acks', async () => {
    const script = `
const d = db.getSiblingDB('${db.databaseName}');
const r = d.runCommand({ readSubscription: 'orders', consumer: 'sh', max: 10, waitMS: 5000 });
if (r.ok !== 1 || r.messages.length !== 3) throw new Error('read ' + tojson(r));
const a = d.runCommand({ ackSubscription: 'orders', consumer: 'sh', deliveryIds: r.messages.map((m) => m.deliveryId) });
if (a.ok !== 1 || Number(a.acked) !== 3) throw new Error('ack ' + tojson(a));
let bad = null;
try { d.runCommand({ readSubscription: 'nope', consumer: 'sh' }); } catch (e) { bad = e; }
if (bad === null || bad.code !== 9100 || bad.codeName !== 'SubscriptionNotFound') throw new Error('error ' + bad);
print('mongosh subscriptions ok');
`;
    const mongosh = path.join(__dirname, 'node_modules', '.bin', 'mongosh');
    const out = execFileSync(mongosh, [uri, '--quiet', '--eval', script], { encoding: 'utf8' });
    assert.match(out, /mongosh subscriptions ok/);
  });

  await check('node: selectors give one message per document per transaction', async () => {
    await db.collection('t').insertMany([{ _id: 1, s: 'a' }, { _id: 2, s: 'a' }]);
    await db.command({
      createSubscription: 'triggers', collection: 't',
      selectors: [{ operations: ['update'], changedFields: ['s'] }],
    });
    const session = client.startSession();
    await session.withTransaction(async () => {
      for (const id of [1, 2]) {
        await db.collection('t').updateOne({ _id: id }, { $set: { s: 'b' } }, { session });
        await db.collection('t').updateOne({ _id: id }, { $set: { other: 1 } }, { session });
        await db.collection('t').updateOne({ _id: id }, { $set: { s: 'c' } }, { session });
      }
    });
    await session.endSession();
    const reply = await db.command({ readSubscription: 'triggers', consumer: 'n', waitMS: 5000 });
    assert.deepEqual(reply.messages.map((m) => m.event.documentKey._id), [1, 2]);
    for (const m of reply.messages) {
      assert.deepEqual(m.changes.map((c) => c.updateDescription.updatedFields.s), ['b', 'c']);
    }
  });

  await check('mongosh: start "snapshot" gives the documents, then the changes', async () => {
    await db.collection('snap').insertMany([{ _id: 1 }, { _id: 2 }]);
    const script = `
const d = db.getSiblingDB('${db.databaseName}');
d.runCommand({ createSubscription: 'copy', collection: 'snap', start: 'snapshot' });
d.snap.insertOne({ _id: 3 });
const seen = [];
for (let i = 0; i < 20 && seen.length < 3; i++) {
  const r = d.runCommand({ readSubscription: 'copy', consumer: 'sh', waitMS: 1000 });
  r.messages.forEach((m) => seen.push((m.event.snapshot ? 's' : 'c') + m.event.documentKey._id));
}
if (seen.join() !== 's1,s2,c3') throw new Error('seen ' + seen.join());
print('mongosh snapshot ok');
`;
    const mongosh = path.join(__dirname, 'node_modules', '.bin', 'mongosh');
    const out = execFileSync(mongosh, [uri, '--quiet', '--eval', script], { encoding: 'utf8' });
    assert.match(out, /mongosh snapshot ok/);
  });

  await check('node: dropSubscription removes it', async () => {
    await db.command({ dropSubscription: 'orders' });
    await assert.rejects(read('n'), (e) => e.code === 9100);
  });

  await db.dropDatabase();
  await client.close();
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

main(process.argv[2] || 'mongodb://127.0.0.1:27017/').catch((e) => {
  console.error(e);
  process.exit(1);
});
