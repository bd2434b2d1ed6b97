// The compare view: a second trace chosen or dropped beside the open one, against
// `gpucollect diff` of the same two traces.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { BASE, LOAD_TIMEOUT, TRACES, spec, traceBytes, tracePath } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

const diffOf = () => JSON.parse(fs.readFileSync(path.join(TRACES, 'diff-training-leak-clean.json'), 'utf8'));
const problems = (list) => list.filter((f) => f.severity !== 'info').length;

/** Checks the compare view's result against the CLI's diff. */
async function assertMatchesDiff(v, d) {
  await v.el('compare-result').waitFor({ timeout: LOAD_TIMEOUT });
  for (const [id, c] of [['compare-peak', d.peak_bytes], ['compare-live-end', d.live_at_end_bytes]]) {
    const row = v.el(id);
    assert.equal(Number(await row.getAttribute('data-before')), c.before, `${id} before`);
    assert.equal(Number(await row.getAttribute('data-after')), c.after, `${id} after`);
    assert.equal(Number(await row.getAttribute('data-delta')), c.delta, `${id} change`);
  }
  assert.equal(await v.count('compare-site'), Math.min(50, d.sites.length), 'one row per changed call site');
  const deltas = await v.all('compare-site').evaluateAll((rows) => rows.map((r) => Number(r.dataset.peakDelta)));
  assert.deepEqual(deltas, d.sites.slice(0, 50).map((s) => s.peak_bytes.delta), 'the diff\'s order and numbers');
  assert.equal(await v.count('compare-resolved-finding'), problems(d.resolved_findings), 'problems gone');
  assert.equal(await v.count('compare-new-finding'), problems(d.new_findings), 'problems new');
  if (problems(d.new_findings) === 0) assert.equal(await v.count('compare-no-new'), 1);
  assert.ok(await v.el('chart-compare').isVisible(), 'both timelines are drawn');
}

test('compare: a second trace chosen in the view gives the CLI diff, the open trace stays open', async (ctx) => {
  const d = diffOf();
  assert.ok(problems(d.resolved_findings) > 0, 'the leak is gone in the clean trace');
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/training-leak.msgpack#view=compare`);
  await v.el('compare-view').waitFor({ timeout: LOAD_TIMEOUT });
  await v.page.setInputFiles('[data-testid="compare-input"]', tracePath('clean.msgpack'));
  await assertMatchesDiff(v, d);
  assert.match(await v.source(), /training-leak/, 'the open trace is still the first one');
  await v.screenshot('compare.png');
  assert.deepEqual(v.pageErrors, []);
});

test('compare: a file dropped on the view is compared, not opened', async (ctx) => {
  const d = diffOf();
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/training-leak.msgpack#view=compare`);
  await v.el('compare-view').waitFor({ timeout: LOAD_TIMEOUT });
  const b64 = traceBytes('clean.msgpack').toString('base64');
  await v.page.evaluate((b64) => {
    const bin = atob(b64);
    const arr = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) arr[i] = bin.charCodeAt(i);
    const dt = new DataTransfer();
    dt.items.add(new File([arr], 'clean.msgpack', { type: 'application/octet-stream' }));
    const target = document.querySelector('[data-testid="compare-view"]');
    target.dispatchEvent(new DragEvent('dragover', { dataTransfer: dt, bubbles: true, cancelable: true }));
    target.dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
  }, b64);
  await assertMatchesDiff(v, d);
  assert.match(await v.source(), /training-leak/, 'the drop did not replace the open trace');
  // A file that is not a trace is refused in words.
  await v.page.setInputFiles('[data-testid="compare-input"]', {
    name: 'picture.png', mimeType: 'image/png', buffer: Buffer.from('\x89PNG\r\n\x1a\n0000', 'binary'),
  });
  const err = await v.el('compare-error').textContent({ timeout: LOAD_TIMEOUT });
  assert.match(err, /PNG image, not a trace/);
  assert.deepEqual(v.pageErrors, []);
});
