// The verdict the overview opens with: on a leaking trace the first screen names the leak, its
// rate and its line, linked to its evidence; a healthy trace's first screen says it is healthy.
import assert from 'node:assert/strict';
import { BASE, report, spec, traceBytes } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

const LEAK_KINDS = ['leak_growth', 'leak_at_exit', 'missed_free', 'thread_exit_leak', 'scope_growth'];

/** Asserts that the verdict is the report's findings, in its order, on the first screen, and
 * that the leak it names first links to its row in the leaks view. */
async function expectLeakVerdict(v, r) {
  const shown = await v.overview.verdict();
  assert.equal(shown.healthy, false, 'a leaking trace is not called healthy');
  assert.deepEqual(shown.items.map((i) => [i.kind, i.severity, i.headline]),
    r.findings.map((f) => [f.kind, f.severity, f.headline]), 'one sentence per finding, in the report\'s order');
  const leak = r.findings[0];
  assert.ok(LEAK_KINDS.includes(leak.kind), `the report ranks a leak first: ${leak.kind}`);
  const first = shown.items[0];
  // Its line and its rate, as the report has them (raw values) and in the sentence.
  assert.ok(leak.location, 'the leak has a line');
  assert.equal(first.location, leak.location);
  assert.ok(first.headline.includes(leak.location), `"${first.headline}" names ${leak.location}`);
  assert.ok(leak.bytes_per_iteration > 0, 'the leak has a rate');
  assert.equal(Number(first.bytesPerIteration), leak.bytes_per_iteration, 'rate per iteration');
  assert.match(first.headline, / per /, `"${first.headline}" gives the rate`);
  assert.ok(await v.overview.verdictOnFirstScreen(), 'the verdict is on the first screen, without scrolling');
  // The sentence links to its evidence: the leak's row in the leaks view, opened.
  await v.overview.openEvidence(0);
  await v.page.locator('main[data-view="leaks"]').waitFor();
  if (leak.stack !== null && await v.page.locator(`[data-testid="leak-row"][data-stack="${leak.stack}"]`).count()) {
    await v.el('leak-detail').waitFor();
    assert.equal(await v.page.locator(`[data-testid="leak-row"][data-stack="${leak.stack}"] button`).getAttribute('aria-expanded'), 'true');
  }
}

test('a leaking CUDA trace: the first screen names the leak, its rate and its line', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/training-leak.msgpack`);
  await v.overview.waitVerdict();
  await expectLeakVerdict(v, report('training-leak'));
  await v.goto(`${BASE}?trace=traces/training-leak.msgpack`);
  await v.overview.waitVerdict();
  await v.screenshot('verdict-leak.png', {});
  assert.deepEqual(v.errors, []);
});

test('a leaking PyTorch snapshot: the first screen names the leak, its rate and its line', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  await v.waitForWelcome();
  await v.drop('snapshot.pickle', traceBytes('snapshot.pickle'));
  await v.overview.waitVerdict();
  await expectLeakVerdict(v, report('snapshot'));
  assert.deepEqual(v.errors, []);
});

test('a healthy trace: the first screen says it is healthy', async (ctx) => {
  const r = report('clean');
  assert.deepEqual(r.findings, [], 'the clean trace has no finding');
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/clean.msgpack`);
  await v.overview.waitVerdict();
  const shown = await v.overview.verdict();
  assert.equal(shown.healthy, true);
  assert.deepEqual(shown.items, []);
  assert.match(shown.text, /^Healthy: no leak, spike, fragmentation or out-of-memory found/);
  assert.ok(await v.overview.verdictOnFirstScreen());
  await v.screenshot('verdict-healthy.png', {});
});
