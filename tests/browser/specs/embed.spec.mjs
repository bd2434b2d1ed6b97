// Demos (no trace needed) and embed mode.
import assert from 'node:assert/strict';
import { BASE, spec } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('demos load without a trace; embed mode hides the chrome', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  await v.click('demo-oom');
  await v.overview.waitLoaded();
  assert.ok(Number(await v.value('ov-failed')) > 0, 'the OOM demo has failed allocations');
  assert.match(v.page.url(), /\?demo=oom/);
  await v.click('tab-fragmentation');
  assert.ok(await v.count('oom-row') > 0);
  await v.screenshot('demo-oom-fragmentation.png');
  const embed = await Viewer.open(ctx, `${BASE}?trace=traces/spikes.msgpack&embed=1#view=timeline`);
  await embed.timeline.waitShown();
  assert.equal(await embed.count('file-picker-label'), 0, 'no header in embed mode');
  await embed.screenshot('embed-timeline.png', {});
});
