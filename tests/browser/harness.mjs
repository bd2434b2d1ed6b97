// What every spec shares: the environment scripts/test-browser.sh sets up, the reports it wrote
// (`gpucollect report --format json`, the expected values), and the way a spec declares tests.
// Env: BASE_URL (the served app, with the traces under /traces/), TRACES (the same traces on
// disk), ARTIFACTS (screenshots), SERVE_URL (a `gpucollect serve` with a store).
import fs from 'node:fs';
import path from 'node:path';

export const BASE = process.env.BASE_URL;
export const TRACES = process.env.TRACES;
export const SERVE_URL = process.env.SERVE_URL;
export const ARTIFACTS = process.env.ARTIFACTS || 'test-artifacts';
/** How long a load may take before a wait fails (a debug build on a busy machine). */
export const LOAD_TIMEOUT = 60_000;

/** `gpucollect report --format json` of `TRACES/<name>.msgpack` (or the file of that name). */
export const report = (name) => JSON.parse(fs.readFileSync(path.join(TRACES, `${name}.json`), 'utf8'));
/** A trace's bytes, to drop on the page. */
export const traceBytes = (file) => fs.readFileSync(path.join(TRACES, file));
/** A trace's path on disk, for the file dialog. */
export const tracePath = (file) => path.join(TRACES, file);
/** Where a screenshot named `name` goes. */
export const artifact = (name) => path.join(ARTIFACTS, name);

/** A spec's test list and the function that adds to it: `const { tests, test } = spec();`,
 * `test('name', async (ctx) => { ... })`, `export default tests`. */
export function spec() {
  const tests = [];
  return { tests, test: (name, fn) => tests.push({ name, fn }) };
}
