// The single-file report of `gpucollect html`, opened offline.
import assert from 'node:assert/strict';
import { TRACES, report, spec, tracePath } from '../harness.mjs';
import { launch } from '../lib.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('gpucollect html: the single-file report opens offline with the same numbers', async () => {
  const offline = await launch();
  try {
    // No network at all: every http(s) request fails.
    await offline.ctx.route(/^https?:/, (route) => route.abort());
    const v = await Viewer.open(offline.ctx, `file://${TRACES}/report.html`);
    await v.overview.expectReport(report('spikes'));
    // Opened from disk: no server to share to, so no Share button.
    assert.equal(await v.count('share'), 0, 'no Share in the offline report');
    // A file opened there is read without the worker (no worker script next to the report).
    await v.pick(tracePath('big-snapshot.pickle'));
    await v.waitForSource('big-snapshot.pickle');
    await v.overview.expectReport(report('big-snapshot'));
    const slices = await v.sliceReaders();
    assert.ok(slices.length >= 3 && slices.every((n) => n === 'page'), `read on the page: ${slices}`);
    await v.goto(`file://${TRACES}/report.html`);
    await v.overview.expectReport(report('spikes'));
    await v.screenshot('single-file-report.png');
    // A PyTorch snapshot's single-file report: the embedded trace has the snapshot's numbers.
    await v.goto(`file://${TRACES}/snapshot-report.html`);
    await v.waitForSource('embedded trace');
    await v.overview.expectReport(report('big-snapshot'));
  } finally {
    await offline.close();
  }
});
