// The call-site table: sums and order as in the report, search, sort and CSV export.
import assert from 'node:assert/strict';
import { BASE, report, spec } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('call sites: sums match the report, search and sort work', async (ctx) => {
  const r = report('spikes');
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack#view=sites`);
  await v.sites.waitShown();
  const all = await v.sites.total();
  assert.ok(all >= 3, `call sites: ${all}`);
  await v.sites.sortBy('peak');
  assert.equal(await v.sites.rows().first().getAttribute('data-stack'), String(r.peak_sites[0].stack), 'largest contribution to the peak first');
  // CSV export of the table: a header and one line per call site.
  const csv = await v.sites.exportCsv();
  assert.equal(csv[0], 'site,allocated_bytes,allocations,at_peak_bytes,live_at_end_bytes,max_size_bytes,stack');
  assert.equal(csv.length - 1, all, 'one CSV line per call site');
  await v.sites.search('attention_scores');
  await v.sites.waitForFewerThan(all);
  assert.match(await v.sites.rows().first().textContent(), /attention_scores/);
});
