// The spikes view: the report's detected spikes, listed and marked on the timeline.
import assert from 'node:assert/strict';
import { BASE, report, spec } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('spikes: the report\'s detected spikes are listed and marked on the timeline', async (ctx) => {
  const r = report('spikes');
  const spikes = r.analysis.timeline_spikes;
  assert.ok(spikes.length > 0, 'the spikes trace has timeline spikes');
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack#view=spikes`);
  await v.spikes.waitShown();
  const rows = await v.spikes.detected();
  const keys = new Set([
    ...spikes.map((s) => `${s.ts_nanos}:${s.stack}`),
    ...r.analysis.scope_spikes.flatMap((sc) => sc.events.map((e) => `${e.ts_nanos}:${e.stack}`)),
  ]);
  assert.equal(rows.length, keys.size, 'one row per detected spike');
  for (const s of spikes) {
    const row = rows.find((x) => x.ts === String(s.ts_nanos));
    assert.ok(row, `spike at ${s.ts_nanos} listed`);
    assert.deepEqual([row.size, row.live, row.timeline], [String(s.size_bytes), String(s.live_bytes), 'true']);
  }
  // The size of a spike as the table shows it, for the chart's label below.
  const sizeText = await v.spikes.sizeTextAt(spikes[0].ts_nanos);
  // On the timeline: one spike marker per detected spike, and the labels in the SVG export.
  await v.click('tab-timeline');
  await v.timeline.waitShown();
  assert.deepEqual(new Set(await v.timeline.markerTimes('spike')), new Set(rows.map((x) => x.ts)), 'a marker per detected spike');
  const svg = await v.timeline.exportSvg();
  assert.ok(svg.includes(`spike ${sizeText}`), `spike markers are drawn with their size (${sizeText})`);
  // A row zooms the timeline on its spike.
  await v.click('tab-spikes');
  await v.spikes.openFirst();
  await v.timeline.waitShown();
  const [t0, t1] = await v.timeline.range();
  const first = BigInt(rows[0].ts);
  assert.ok(t0 <= first && first <= t1, 'the window holds the spike');
  await v.screenshot('timeline-spike.png');
  assert.deepEqual(v.errors, []);
});

test('each column of times is written in one unit, with one precision', async (ctx) => {
  // The demo runs for about 3 s: its spikes fall on both sides of 1 s ("850.00 ms", "1.20 s"
  // was one column).
  for (const url of [`${BASE}?trace=traces/spikes.msgpack#view=spikes`, `${BASE}?demo=spikes#view=spikes`]) {
    const v = await Viewer.open(ctx, url);
    await v.spikes.waitShown();
    for (const table of ['detected-spikes-table', 'spikes-table']) {
      const at = await v.spikes.atColumn(table);
      assert.ok(at.length >= 2, `${url} ${table}: ${at}`);
      const parsed = at.map((t) => /^\d+(?:\.(\d+))? (ns|µs|ms|s|min|h)$/.exec(t));
      assert.ok(parsed.every(Boolean), `${url} ${table}: a number and a unit each: ${at}`);
      assert.equal(new Set(parsed.map((m) => m[2])).size, 1, `${url} ${table}: one unit in ${at}`);
      assert.equal(new Set(parsed.map((m) => (m[1] || '').length)).size, 1, `${url} ${table}: one precision in ${at}`);
    }
    assert.deepEqual(v.errors, []);
    await v.close();
  }
});
