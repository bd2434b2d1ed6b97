// The frame search: one box (in the filter bar) keeps, in every view, the stacks with a frame
// that holds the text (any frame, not only the innermost label), and rides in the link (`q=`).
// Rows whose innermost label several stacks share are marked and list those stacks.
import assert from 'node:assert/strict';
import { BASE, report, spec } from '../harness.mjs';
import { StacksPage } from '../pages/stacks.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

const scopesOf = async (v) => (await v.leaks.scopeRows()).map((r) => r.scope).sort();

test('a link with a frame search filters the scopes, leaks, call sites and Memory by stack by any frame', async (ctx) => {
  const r = report('nvtx-leak');
  // `train.py:150` is an outer frame (the validation loop's caller): no label, scope name or
  // top call site holds it.
  const q = 'train.py:150';
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/nvtx-leak.msgpack#view=leaks&q=${encodeURIComponent(q)}`);
  await v.leaks.waitScopes();
  assert.equal(await v.sites.searchText(), q, 'the box shows the search of the link');
  const kept = r.analysis.scopes.filter((s) => s.top_stack != null).map((s) => s.scope).sort();
  assert.ok(kept.length > 0 && kept.length < r.analysis.scopes.length, `scopes with a top stack: ${kept}`);
  assert.deepEqual(await scopesOf(v), kept, 'the scopes whose top stack has the frame');
  // The live-at-end table keeps the sites whose stack has the frame.
  const leakRows = await v.leaks.leakRows().evaluateAll((els) => els.map((e) => e.dataset.stack));
  assert.deepEqual(leakRows, r.live_at_end_sites.filter((s) => s.frames.some((f) => f.includes(q))).map((s) => String(s.stack)));
  // Call sites: every row has the frame somewhere in its stack, never in its label.
  await v.openTab('sites');
  await v.sites.waitShown();
  const rows = await v.sites.rowsData();
  assert.ok(rows.length >= 2, `rows: ${rows.length}`);
  for (const row of rows) {
    assert.ok(row.text.includes(q), `row ${row.stack} has the frame`);
    assert.ok(!row.label.includes(q), `matched by an outer frame, not the label ${row.label}`);
  }
  // Memory by stack at the peak: only the bytes of the stacks with the frame.
  await v.openTab('stacks');
  const s = new StacksPage(v);
  await s.waitShown();
  await s.show('peak');
  const keptPeak = r.peak_sites.filter((x) => x.frames.some((f) => f.includes(q))).reduce((n, x) => n + x.bytes, 0);
  assert.ok(keptPeak > 0 && keptPeak < r.peak_bytes, `${keptPeak} of ${r.peak_bytes}`);
  assert.equal((await s.total())[0], keptPeak, 'the icicle holds only the matching stacks');
  // Clearing the box (in any view) brings everything back, here and in the link.
  await v.sites.search('');
  await v.page.waitForFunction((n) => Number(document.querySelector('[data-testid="flame-total"]').dataset.value) === n, r.peak_bytes);
  await v.page.waitForFunction(() => !new URLSearchParams(location.hash.slice(1)).has('q'));
  await v.openTab('leaks');
  await v.leaks.waitScopes();
  assert.deepEqual(await scopesOf(v), r.analysis.scopes.map((x) => x.scope).sort());
  // Typing in the box on the leaks view filters its tables at once.
  await v.sites.search('keep_predictions');
  await v.page.waitForFunction((n) => document.querySelectorAll('[data-testid="scope-row"]').length === n, kept.length);
  await v.screenshot('search.png');
});

test('call sites whose innermost label several stacks share are marked and list those stacks', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/nvtx-leak.msgpack#view=sites`);
  await v.sites.waitShown();
  const rows = await v.sites.rowsData();
  const byLabel = new Map();
  for (const row of rows) byLabel.set(row.label, [...(byLabel.get(row.label) ?? []), row.stack]);
  // `forward (model.py:33)` is reached from the training step and from validation.
  const shared = [...byLabel].filter(([, stacks]) => stacks.length > 1);
  assert.ok(shared.length > 0, `a label of several stacks: ${[...byLabel.keys()]}`);
  for (const row of rows) {
    assert.equal(row.shared, byLabel.get(row.label).length > 1 ? byLabel.get(row.label).length : 0, `mark of ${row.label} (${row.stack})`);
  }
  const [label, stacks] = shared[0];
  const listed = await v.sites.sharedStacks(stacks[0]);
  assert.deepEqual(listed.map((x) => x.stack).sort(), [...stacks].sort(), `the stacks of ${label}`);
  assert.equal(new Set(listed.map((x) => x.text)).size, listed.length, 'each listed stack differs');
  for (const x of listed) assert.ok(x.text.startsWith(label), `${x.text} starts at ${label}`);
  // The marks count every call site, also while a search hides some of them.
  const outer = listed[0].text.split(' ← ').at(-1);
  await v.sites.search(outer);
  await v.sites.waitForFewerThan(rows.length);
  const row = (await v.sites.rowsData()).find((x) => x.stack === listed[0].stack);
  assert.equal(row?.shared, stacks.length);
  await v.screenshot('search-shared.png');
});
