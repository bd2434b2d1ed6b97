// The leaks view: live-at-end call sites and the scope table, against the report.
import assert from 'node:assert/strict';
import { BASE, report, spec } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';
import { assertBytesText } from '../pages/values.mjs';

const { tests, test } = spec();
export default tests;

test('leaks: live-at-end sites add up and rows expand to a growth chart and stack', async (ctx) => {
  const r = report('multi-device');
  assert.ok(r.live_at_end_bytes > 0, 'the multi-device trace leaves memory live');
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/multi-device.msgpack#view=leaks`);
  await v.leaks.waitShown();
  assert.equal(await v.leaks.sumLive(), r.live_at_end_bytes);
  // The device selector narrows the table to that device's live memory.
  for (const d of r.devices) {
    await v.selectDevice(String(d.device));
    await v.page.waitForFunction(([n]) => document.querySelectorAll('[data-testid="leak-row"]').length === n || n < 0,
      [d.live_at_end_bytes === 0 ? 0 : -1]);
    await v.page.waitForTimeout(100);
    assert.equal(await v.leaks.sumLive(), d.live_at_end_bytes, `live at end on GPU ${d.device}`);
  }
  await v.selectDevice('all');
  await v.page.waitForFunction((n) => document.querySelectorAll('[data-testid="leak-row"]').length >= n, 1);
  const detail = await v.leaks.expandFirst();
  assert.ok(await detail.locator('[data-testid="stack"] li').count() > 0);
  await v.screenshot('leaks-expanded.png');
});

/** The severity the report gives a scope: a leak found in it, or its growth finding or note. */
const SCOPE_KINDS = ['scope_growth', 'bounded_growth', 'leak_growth', 'leak_at_exit', 'missed_free', 'thread_exit_leak'];
function scopeSeverity(r, scope) {
  const order = ['info', 'warning', 'critical'];
  const sevs = [...r.findings, ...r.notes]
    .filter((f) => SCOPE_KINDS.includes(f.kind) && f.scope === scope)
    .map((f) => f.severity);
  return sevs.length ? sevs.sort((a, b) => order.indexOf(b) - order.indexOf(a))[0] : 'none';
}

test('leaks: the scope table equals the report (growth, per call, calls, severity), sorts, exports, expands', async (ctx) => {
  const r = report('nvtx-leak');
  const scopes = r.analysis.scopes;
  assert.ok(scopes.length >= 2, 'the nvtx-leak trace has several scopes');
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/nvtx-leak.msgpack#view=leaks`);
  await v.leaks.waitScopes();
  const shown = await v.leaks.scopeRows();
  assert.equal(shown.length, scopes.length, 'one row per scope');
  for (const [i, row] of shown.entries()) {
    const s = scopes[i];
    assert.equal(row.scope, s.scope, 'report order: largest growth first');
    assert.equal(Number(row.total), s.total_growth_bytes, `${s.scope} total growth`);
    assert.equal(Number(row.avg), s.avg_growth_bytes, `${s.scope} growth per call`);
    assert.equal(Number(row.calls), s.calls, `${s.scope} calls`);
    assert.equal(row.reference, String(s.reference_leak), `${s.scope} reference rule`);
    assert.equal(row.growth, s.total_growth_bytes <= 0 ? 'none' : s.bounded ? 'bounded' : 'unbounded');
    assert.equal(row.severity, scopeSeverity(r, s.scope), `${s.scope} severity`);
    // The growth as people read it, signed (+ for growth), stands for the report's number.
    const total = await v.leaks.scopeCell(s.scope, 'total');
    assertBytesText(total, s.total_growth_bytes, `${s.scope} total growth shown`);
    assert.equal(total[0], s.total_growth_bytes < 0 ? '-' : '+', `${s.scope} total growth signed`);
  }
  const flagged = scopes.find((s) => s.reference_leak && !s.explained_by);
  assert.ok(flagged, 'the report flags a scope');
  assert.notEqual(scopeSeverity(r, flagged.scope), 'none');
  // Sorting: calls, descending then ascending; severity puts the flagged scope first.
  await v.leaks.sortScopesBy('calls');
  let calls = (await v.leaks.scopeRows()).map((x) => Number(x.calls));
  assert.deepEqual(calls, [...calls].sort((a, b) => b - a), 'calls descending');
  await v.leaks.sortScopesBy('calls');
  await v.leaks.waitScopeSort('calls', 'ascending');
  calls = (await v.leaks.scopeRows()).map((x) => Number(x.calls));
  assert.deepEqual(calls, [...calls].sort((a, b) => a - b), 'calls ascending');
  await v.leaks.sortScopesBy('severity');
  assert.equal((await v.leaks.scopeRows())[0].scope, flagged.scope, 'most severe first');
  // CSV export of the scope table.
  const csv = await v.leaks.exportScopesCsv();
  assert.match(csv[0], /^scope,kind,severity,total_growth_bytes,avg_growth_bytes,calls,/);
  assert.equal(csv.length - 1, scopes.length, 'one CSV line per scope');
  assert.ok(csv.some((l) => l.startsWith(`${flagged.scope},NVTX range,${scopeSeverity(r, flagged.scope)},${flagged.total_growth_bytes},`)));
  // The flagged row expands to its growth chart and the stack that kept the bytes.
  const detail = await v.leaks.expandScope(flagged.scope);
  await detail.locator('canvas[data-testid="chart-scope-growth"]').waitFor();
  assert.equal(await detail.locator('[data-testid="scope-top-bytes"]').getAttribute('data-value'), String(flagged.top_site_bytes));
  assert.ok(await detail.locator('[data-testid="stack"] li').count() > 0, 'full stack');
  assert.equal(await v.leaks.scopeRow(flagged.scope).locator('button').getAttribute('aria-expanded'), 'true');
  // The live-at-end table is still there, below.
  assert.ok(await v.leaks.leakRows().count() > 0);
  await v.screenshot('leaks-scopes.png');
  assert.deepEqual(v.errors, []);
});
