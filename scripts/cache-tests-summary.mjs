// What each results file of the public HTTP cache test suite comes to, as
// cache-tests.fyi counts it (dependencies honoured): tests passed, required
// tests failed (by name), optimal ones missed, and the rest.
//
//   node scripts/cache-tests-summary.mjs SUITE_DIR RESULTS.json...
import fs from 'fs'
import path from 'path'

const suite = path.resolve(process.argv[2])
const { default: tests } = await import(path.join(suite, 'tests/index.mjs'))
const { determineTestResult, resultTypes } = await import(path.join(suite, 'test-engine/lib/results.mjs'))
const kinds = Object.keys(resultTypes)

console.log('| results | passed | required failed | optimal missed | checks yes/no | dependency failed | setup or harness |')
console.log('|---|---|---|---|---|---|---|')
const failures = []
for (const file of process.argv.slice(3)) {
  const results = JSON.parse(fs.readFileSync(file, 'utf8'))
  const n = Object.fromEntries(kinds.map(k => [k, 0]))
  const failed = []
  for (const s of tests) {
    for (const t of s.tests) {
      const kind = kinds.find(k => resultTypes[k] === determineTestResult(tests, t.id, results))
      n[kind] += 1
      if (kind === 'fail') failed.push(t.id)
    }
  }
  const other = n.setup_fail + n.harness_fail + n.retry
  console.log(`| ${path.basename(file, '.json')} | ${n.pass} | ${n.fail} | ${n.optional_fail} | ${n.yes}/${n.no} | ${n.dependency_fail} | ${other} |`)
  failures.push(`${path.basename(file, '.json')}: ${failed.join(' ') || '(none)'}`)
}
console.log('\nRequired failures:')
for (const f of failures) console.log(f)
