#!/usr/bin/env node
// Decodes resume tokens with mongodb-resumetoken-decoder and prints them as plain JSON.
//
// Input (stdin, or the first argument): a JSON array of `_data` hex strings.
// Output (stdout): a JSON array; per token either {ok: {...decoded fields...}} or {error: msg}.
// BSON values are tagged so that nothing is lost in JSON: {$number: "<String(n)>"},
// {$oid}, {$binary: {hex, sub}}, {$doc: [[key, value], ...]} (in JS property order), etc.
'use strict';

const fs = require('fs');
const { decodeResumeToken } = require('mongodb-resumetoken-decoder');

function norm(v) {
  if (v === null) return null;
  if (v === undefined) return { $undefined: true };
  switch (typeof v) {
    case 'boolean': return v;
    case 'string': return v;
    case 'number': return { $number: Object.is(v, -0) ? '-0' : String(v) };
    case 'bigint': return { $number: v.toString() };
    default: break;
  }
  if (Array.isArray(v)) return { $array: v.map(norm) };
  if (v instanceof Date) return { $date: v.getTime() };
  switch (v._bsontype) {
    case 'ObjectId':
    case 'ObjectID':
      return { $oid: v.toHexString() };
    case 'Timestamp':
      return { $timestamp: { t: v.getHighBits() >>> 0, i: v.getLowBits() >>> 0 } };
    case 'Binary':
      return { $binary: { hex: v.toString('hex'), sub: v.sub_type } };
    case 'MinKey': return { $minKey: 1 };
    case 'MaxKey': return { $maxKey: 1 };
    case 'BSONRegExp': return { $regex: v.pattern, $options: v.options };
    case 'Code': return v.scope ? { $code: v.code, $scope: norm(v.scope) } : { $code: v.code };
    case 'DBRef': return { $dbref: { ns: v.collection, id: norm(v.oid) } };
    default: break;
  }
  return { $doc: Object.keys(v).map(k => [k, norm(v[k])]) };
}

function decodeOne(hex) {
  try {
    const t = decodeResumeToken(hex);
    const out = {
      timestamp: norm(t.timestamp),
      version: t.version,
      txnOpIndex: t.txnOpIndex,
      uuid: t.uuid ? t.uuid.toString('hex') : null
    };
    if (t.tokenType !== undefined) out.tokenType = t.tokenType;
    if (t.fromInvalidate !== undefined) out.fromInvalidate = t.fromInvalidate;
    if ('eventIdentifier' in t) out.eventIdentifier = norm(t.eventIdentifier);
    if ('documentKey' in t) out.documentKey = norm(t.documentKey);
    return { ok: out };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
}

const input = process.argv[2] !== undefined ? process.argv[2] : fs.readFileSync(0, 'utf8');
const tokens = JSON.parse(input);
process.stdout.write(JSON.stringify(tokens.map(decodeOne)) + '\n');
