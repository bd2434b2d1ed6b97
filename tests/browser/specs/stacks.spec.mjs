// Memory by stack: the icicle graph of the live memory at the peak, the pinned moment and the
// end, with the report's totals; a click on a frame filters the timeline and the tables.
import assert from 'node:assert/strict';
import { BASE, report, spec } from '../harness.mjs';
import { StacksPage } from '../pages/stacks.mjs';
import { TimelineSites } from '../pages/timeline-sites.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

const stacksOf = (v, id) => v.all(id).evaluateAll((els) => els.map((e) => e.dataset.stack));

test('the icicle at the peak, the pin and the end holds the report\'s bytes; a frame filters the timeline and the tables', async (ctx) => {
  const r = report('nvtx-leak');
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/nvtx-leak.msgpack#view=leaks`);
  await v.leaks.waitShown();
  const leaksBefore = await stacksOf(v, 'leak-row');
  await v.openTab('sites');
  const sitesBefore = await stacksOf(v, 'site-row');
  await v.openTab('stacks');
  const s = new StacksPage(v);
  await s.waitShown();
  await s.show('end');
  const [end] = await s.total();
  assert.equal(end, r.live_at_end_bytes, 'everything live at the end');
  assert.equal(await v.page.locator('[data-testid="moment-pinned"]').isDisabled(), true, 'nothing pinned yet');
  await s.show('peak');
  const [peak, peakTs] = await s.total();
  assert.equal(peak, r.peak_bytes, 'everything live at the peak');
  assert.equal(peakTs, String(r.peak_ts_nanos));
  const cells = await s.cells();
  const top = cells.filter((c) => c.depth === 0).reduce((n, c) => n + c.bytes, 0);
  assert.ok(top <= peak && top >= peak * 0.99, `the outermost frames hold the bytes (${top} of ${peak})`);
  // The biggest frame that only some of the stacks live at the peak have.
  const frame = cells.filter((c) => c.depth >= 1 && c.bytes < peak).sort((a, b) => b.bytes - a.bytes)[0];
  assert.ok(frame, `a frame not under every stack: ${JSON.stringify(cells.slice(0, 5))}`);
  await s.pick(frame.label, frame.depth);
  await v.page.waitForFunction((q) => new URLSearchParams(location.hash.slice(1)).get('q') === q, frame.label);
  await v.screenshot('stacks.png');
  // The call-site table keeps the sites with that frame (the search box shows it).
  await v.openTab('sites');
  assert.equal(await v.page.inputValue('[data-testid="site-search"]'), frame.label);
  const matching = await stacksOf(v, 'site-row');
  assert.ok(matching.length > 0 && matching.length < sitesBefore.length, `sites ${sitesBefore.length} -> ${matching.length}`);
  // So does the leak table.
  await v.openTab('leaks');
  await v.leaks.waitShown();
  const leaksAfter = await stacksOf(v, 'leak-row');
  assert.ok(leaksAfter.length <= leaksBefore.length);
  for (const l of leaksAfter) assert.ok(matching.includes(l), `leak row ${l} has the frame`);
  // The timeline stacks only those sites.
  await v.openTab('timeline');
  const t = new TimelineSites(v);
  await t.waitStacked();
  const bands = (await t.legend()).filter((b) => b[0] !== 'other').map((b) => b[0]);
  assert.ok(bands.length >= 1, 'some sites stacked');
  for (const b of bands) assert.ok(matching.includes(b), `band ${b} has the frame`);
  // Pinned: the graph of that moment.
  await v.timeline.pinAt(0.5, 0.5);
  const pinned = await v.timeline.pinned();
  await v.openTab('stacks');
  await s.waitShown();
  const [, ts, moment] = await s.total();
  assert.deepEqual([ts, moment], [pinned, 'pinned'], 'opens at the pinned moment');
  assert.deepEqual(v.errors, []);
});
