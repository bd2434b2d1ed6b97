// Fragmentation: at each failed allocation, the request against the largest free block (the
// widest gap between the live device allocations, by address) and the address map it comes
// from; the overview shows the same number for the first failure.
import assert from 'node:assert/strict';
import { BASE, LOAD_TIMEOUT, report, spec } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

const largestFree = async (v, id) => {
  const el = v.el(id);
  await el.waitFor();
  return { value: Number(await el.getAttribute('data-value')), requested: Number(await el.getAttribute('data-requested')), text: (await el.textContent()).trim() };
};

test('the overview and the fragmentation view show the report\'s largest free block at the failure', async (ctx) => {
  const r = report('fragmented');
  const [oom] = r.analysis.oom;
  assert.ok(oom?.gaps, 'the report has the failure\'s address gaps');
  // The scenario: enough free in all, no hole big enough for the request.
  assert.ok(oom.gaps.free_bytes >= oom.requested_bytes && oom.gaps.largest_free_bytes < oom.requested_bytes, JSON.stringify(oom));
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/fragmented.msgpack`);
  const ov = await largestFree(v, 'ov-largest-free');
  assert.equal(ov.value, oom.gaps.largest_free_bytes, 'overview: the report\'s largest free block');
  assert.equal(ov.requested, oom.requested_bytes);
  await v.openTab('fragmentation');
  const fr = await largestFree(v, 'oom-largest-free');
  assert.equal(fr.value, ov.value, 'the fragmentation view shows the overview\'s number');
  assert.equal(fr.text, ov.text, 'in the same words');
  const row = await v.el('oom-row').textContent();
  assert.match(row, /does not fit/, 'the request does not fit the largest free block');
  // The address map at the failure: live allocations and gaps tile the report's span, its free
  // bytes are the report's, and the marked gap is the largest free block shown above.
  const map = v.el('addr-map');
  assert.equal(Number(await map.getAttribute('data-free')), oom.gaps.free_bytes);
  assert.equal(Number(await map.getAttribute('data-free')) + Number(await map.getAttribute('data-live')), oom.gaps.span_bytes);
  const widest = map.locator('[data-testid="addr-largest"]');
  assert.equal(await widest.getAttribute('data-live'), 'false');
  assert.equal(Number(await widest.getAttribute('data-bytes')), fr.value);
  const gaps = await map.locator('[data-testid="addr-stretch"]').evaluateAll((els) => els.filter((e) => e.dataset.live === 'false').map((e) => Number(e.dataset.bytes)));
  assert.ok(gaps.length > 0 && gaps.every((g) => g <= fr.value), `other gaps ${gaps} within ${fr.value}`);
  assert.ok((await widest.boundingBox()).width > 0, 'the largest gap is drawn');
  await v.screenshot('fragmentation-oom.png');
});

test('a failure whose addresses tell nothing shows no largest free block', async (ctx) => {
  const r = report('snapshot');
  assert.ok(r.analysis.oom.length > 0 && r.analysis.oom.every((o) => o.gaps == null));
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/snapshot.pickle#view=fragmentation`);
  await v.el('oom-row').waitFor();
  assert.equal(await v.count('oom-largest-free'), 0);
  assert.match(await v.el('oom-row').textContent(), /not recorded/);
  assert.equal(await v.count('addr-map'), 0, 'no address map without known gaps');
  await v.openTab('overview');
  await v.el('ov-failed').waitFor();
  assert.equal(await v.count('ov-largest-free'), 0);
});

test('the address map follows the pinned moment: at the failure it has the report\'s gaps, unpinned it shows the peak', async (ctx) => {
  const r = report('fragmented');
  const [oom] = r.analysis.oom;
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/fragmented.msgpack#view=fragmentation&pin=${oom.ts_nanos}`);
  const pinned = v.page.locator(`[data-testid="pinned-addr-map"][data-device="${oom.device}"]`);
  await pinned.waitFor();
  assert.equal(await pinned.getAttribute('data-ts'), String(oom.ts_nanos));
  assert.equal(Number(await pinned.getAttribute('data-free')), oom.gaps.free_bytes);
  assert.equal(Number(await pinned.getAttribute('data-largest')), oom.gaps.largest_free_bytes);
  // Unpinned (Esc), the map is the peak's.
  await v.page.keyboard.press('Escape');
  await v.page.waitForFunction((t) => document.querySelector('[data-testid="pinned-addr-map"]')?.dataset.ts === t, String(r.peak_ts_nanos));
  await v.screenshot('fragmentation-pinned.png');
});

test('the view writes its moments alike: the OOM row, its address map and the addresses\' heading', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/fragmented.msgpack#view=fragmentation`);
  await v.el('oom-row').waitFor({ timeout: LOAD_TIMEOUT });
  const at = (await v.el('oom-row').locator('td').first().textContent()).trim();
  const caption = await v.el('addr-map').locator('figcaption').textContent();
  assert.ok(caption.includes(` at ${at}:`), `the map of the failure at ${at}: "${caption}"`);
  const heading = await v.page.locator('h3', { hasText: 'Addresses at the peak' }).textContent();
  const form = (t) => { const m = /(\d+)\.(\d+) (ns|µs|ms|s|min|h)\b/.exec(t); return m && `${m[2].length} ${m[3]}`; };
  assert.equal(form(heading), form(at), `"${heading}" as "${at}"`);
  assert.deepEqual(v.errors, []);
});
