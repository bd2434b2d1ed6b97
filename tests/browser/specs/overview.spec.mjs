// The overview: its numbers equal `gpucollect report --format json`; every view renders.
import assert from 'node:assert/strict';
import { BASE, report, spec, traceBytes } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('drag and drop a trace: overview equals gpucollect report', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  await v.waitForWelcome();
  await v.drop('spikes.msgpack', traceBytes('spikes.msgpack'));
  await v.overview.expectReport(report('spikes'));
  assert.equal(await v.source(), 'spikes.msgpack');
  assert.equal(await v.errorPanel.shown(), false, 'no error panel for a good trace');
  await v.screenshot('overview.png');
  assert.deepEqual(v.errors, []);
});

test('?trace=URL loads, every view renders, screenshots', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/multi-device.msgpack`);
  await v.overview.expectReport(report('multi-device'));
  for (const view of ['timeline', 'leaks', 'spikes', 'fragmentation', 'sites', 'overview']) {
    await v.openTab(view);
    await v.page.waitForTimeout(200);
    await v.screenshot(`view-${view}.png`);
  }
  // Several devices: the device selector exists.
  assert.ok(await v.count('filter-device'), 'device selector');
  assert.deepEqual(v.errors, []);
});
