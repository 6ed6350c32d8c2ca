// mongosh interop: `mongosh --eval` against a live Tributary server connects, inserts, finds,
// reads one change event from db.c.watch(), and runs the admin helpers (db.stats(),
// db.c.stats(), show dbs, db.currentOp()).
//
// Usage: node tests/js/mongosh.js mongodb://127.0.0.1:PORT/
// Runs the mongosh installed in tests/js/node_modules (npm install there). The last line is
// "N passed, N failed"; the exit status is non-zero on failure.
'use strict';

const { execFileSync } = require('node:child_process');
const path = require('node:path');

const SCRIPT = `
const d = db.getSiblingDB('mongosh_check');
d.c.drop();
d.c.insertOne({ _id: 1, x: 'hello' });
const found = d.c.findOne({ _id: 1 });
if (!found || found.x !== 'hello') throw new Error('find returned ' + tojson(found));
const cs = d.c.watch();
if (cs.tryNext() !== null) throw new Error('an event before any write');
d.c.insertOne({ _id: 2 });
let ev = null;
for (let i = 0; i < 100 && ev === null; i++) ev = cs.tryNext();
if (ev === null || ev.operationType !== 'insert' || ev.documentKey._id !== 2) {
  throw new Error('unexpected change event ' + tojson(ev));
}
cs.close();
// The admin helpers people call.
const dbStats = d.stats();
if (dbStats.ok !== 1 || Number(dbStats.objects) !== 2 || dbStats.db !== 'mongosh_check') {
  throw new Error('db.stats() ' + tojson(dbStats));
}
const collStats = d.c.stats();
if (Number(collStats.count) !== 2 || collStats.ns !== 'mongosh_check.c' || !(collStats.size > 0)) {
  throw new Error('db.c.stats() ' + tojson(collStats));
}
const dbs = db.getMongo().getDBs().databases.map((x) => x.name);
if (!dbs.includes('mongosh_check')) throw new Error('getDBs() ' + tojson(dbs));
show('dbs');
const ops = db.currentOp();
if (ops.ok !== 1 || !Array.isArray(ops.inprog)) throw new Error('db.currentOp() ' + tojson(ops));
d.dropDatabase();
print('MONGOSH_CHECK_OK ' + ev.operationType + ' ' + ev.documentKey._id);
`;

function main(uri) {
  const bin = path.join(__dirname, 'node_modules', '.bin', 'mongosh');
  try {
    const out = execFileSync(bin, [uri, '--quiet', '--norc', '--eval', SCRIPT], {
      encoding: 'utf8',
      timeout: 120000,
      env: { ...process.env, MONGOSH_NO_UPDATE_CHECK: '1', DO_NOT_TRACK: '1' },
    });
    if (!out.includes('MONGOSH_CHECK_OK insert 2')) {
      throw new Error('mongosh did not confirm the event; output:\n' + out);
    }
    console.log('ok    mongosh --eval: insert, find, watch, db.stats, db.c.stats, show dbs, db.currentOp');
    console.log('1 passed, 0 failed: mongosh');
    return 0;
  } catch (e) {
    const detail = [e.message, e.stdout, e.stderr].filter(Boolean).join('\n');
    console.log(`FAIL  mongosh --eval: ${detail}`);
    console.log('0 passed, 1 failed: mongosh');
    return 1;
  }
}

process.exit(main(process.argv[2] || 'mongodb://127.0.0.1:27017/'));
