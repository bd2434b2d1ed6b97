// Errors in words: files that are not traces, newer formats, cut traces, missing URLs, and the
// WebAssembly stopping.
import assert from 'node:assert/strict';
import { BASE, report, spec, traceBytes } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('bad files show the error panel and keep what decoded', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  await v.waitForWelcome();
  await v.drop('notes.txt', Buffer.from('these are not the bytes you are looking for\n'.repeat(50)));
  await v.errorPanel.waitShown();
  assert.match(await v.errorPanel.message(), /not a gpucollect trace/);
  await v.screenshot('error-not-a-trace.png', {});

  await v.drop('newer.msgpack', traceBytes('newer.msgpack'));
  await v.errorPanel.waitForMessage(/format version 2\./);

  await v.drop('truncated.msgpack', traceBytes('truncated.msgpack'));
  await v.overview.waitLoaded();
  await v.errorPanel.waitShown();
  assert.match(await v.errorPanel.text(), /truncated|no end record/);
  const r = report('truncated');
  assert.equal(await v.value('ov-records'), String(r.records), 'the decoded part is kept');
  assert.equal(await v.value('ov-peak'), String(r.peak_bytes));
  await v.screenshot('error-truncated.png');

  const missing = await Viewer.open(ctx, `${BASE}?trace=traces/missing.msgpack`);
  await missing.errorPanel.waitShown();
  assert.match(await missing.errorPanel.message(), /404.*traces\/missing\.msgpack/);
});

test('when the WebAssembly stops (a trap, as when its memory is full), the page says so and what to do', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  await v.waitForWelcome();
  // Another page error is not the viewer stopping.
  await v.page.evaluate(() => setTimeout(() => { throw new Error('not the viewer'); }));
  await v.page.waitForTimeout(200);
  assert.equal(await v.count('fatal-error'), 0);
  // What a failed allocation in the WebAssembly throws (an abort: `unreachable`), uncaught.
  await v.page.evaluate(() => setTimeout(() => { throw new WebAssembly.RuntimeError('unreachable'); }));
  await v.errorPanel.fatal.waitFor();
  const said = await v.errorPanel.fatal.textContent();
  for (const part of ['The viewer stopped', 'unreachable', '4 GiB', 'Reload the page', 'gpucollect report']) {
    assert.ok(said.includes(part), `says ${part}: ${said}`);
  }
  await v.screenshot('viewer-stopped.png', {});
});
