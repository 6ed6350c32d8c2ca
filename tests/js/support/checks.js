// What the Node.js check scripts share: run each check on its own, report, and exit.
//
// A check is an async function; a failing one prints its stack and the rest still run. The
// last line is "N passed, N failed: <label>"; the exit status is non-zero if any check failed
// or the setup itself did. (This folder is not run by scripts/test.sh, which runs
// tests/js/*.js.)
'use strict';

/** Runs `checks` with `args`; returns the number that failed. `failed` counts failures found
 * before (a missing precondition). */
async function runChecks(checks, args, failed = 0) {
  let passed = 0;
  for (const check of checks) {
    try {
      await check(...args);
      passed += 1;
      console.log(`ok    ${check.name}`);
    } catch (e) {
      failed += 1;
      console.log(`FAIL  ${check.name}: ${e && e.stack ? e.stack : e}`);
    }
  }
  return { passed, failed };
}

/** Prints the summary line of `result` under `label`; the exit status it calls for. */
function summary(result, label) {
  console.log(`${result.passed} passed, ${result.failed} failed: ${label}`);
  return result.failed === 0 ? 0 : 1;
}

/** Runs `main(uri)` (the script's URI argument, else the default) and exits with its status;
 * a failure of the setup is one failed check. */
function exitWith(main, label) {
  main(process.argv[2] || 'mongodb://127.0.0.1:27017/')
    .then((code) => process.exit(code))
    .catch((e) => {
      console.log(`FAIL  setup: ${e && e.stack ? e.stack : e}`);
      console.log(`0 passed, 1 failed: ${label}`);
      process.exit(1);
    });
}

module.exports = { runChecks, summary, exitWith };
