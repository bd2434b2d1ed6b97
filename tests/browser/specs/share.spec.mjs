// Links: "Copy link" reopens the same view (and says when the link cannot carry the file);
// "Share" asks, then uploads to `gpucollect serve` (a PyTorch snapshot as a trace).
import assert from 'node:assert/strict';
import { BASE, LOAD_TIMEOUT, SERVE_URL, report, spec, startServe, traceBytes } from '../harness.mjs';
import { launch } from '../lib.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('a copied link reopens the same view', async (ctx) => {
  const v = await Viewer.open(ctx, `${BASE}?trace=traces/multi-device.msgpack`);
  await v.overview.waitLoaded();
  await v.click('tab-timeline');
  await v.timeline.zoomIn();
  await v.timeline.zoomIn();
  await v.timeline.panRight();
  await v.selectDevice({ index: 2 });
  const pin = await v.timeline.pinAt(0.5, 0.5);
  const range = await v.timeline.range();
  const device = await v.deviceFilter().inputValue();
  const link = await v.copyLink();
  assert.match(link, /\?trace=.*#view=timeline&t0=\d+&t1=\d+&pin=\d+&device=\d+/);
  const again = await Viewer.open(ctx, link);
  await again.timeline.waitShown();
  assert.equal(await again.view(), 'timeline');
  assert.deepEqual(await again.timeline.range(), range);
  assert.equal(await again.timeline.pinned(), pin);
  assert.equal(await again.deviceFilter().inputValue(), device);
  await again.close();
});

test('Share uploads to gpucollect serve; the link opens the same view in a fresh browser', async (ctx) => {
  assert.ok(SERVE_URL, 'SERVE_URL is set by scripts/test-browser.sh');
  const v = await Viewer.open(ctx, SERVE_URL);
  await v.waitForWelcome();
  await v.drop('multi-device.msgpack', traceBytes('multi-device.msgpack'));
  await v.overview.waitLoaded();
  await v.click('tab-sites');
  const link = await v.share();
  assert.match(link, /view=sites/, link);
  const fresh = await launch();
  try {
    const other = await Viewer.open(fresh.ctx, link);
    await other.page.locator('[data-testid="tab-sites"][aria-selected="true"]').waitFor({ timeout: LOAD_TIMEOUT });
    await other.screenshot('shared-link-fresh-profile.png');
    await other.click('tab-overview');
    await other.overview.expectReport(report('multi-device'));
    assert.deepEqual(other.errors, [], 'no errors (CSP included)');
  } finally {
    await fresh.close();
  }
});

test('Share asks first; a dropped PyTorch snapshot is converted and shared; Copy link says a dropped file stays here', async (ctx) => {
  assert.ok(SERVE_URL, 'SERVE_URL is set by scripts/test-browser.sh');
  const v = await Viewer.open(ctx, SERVE_URL);
  await v.waitForWelcome();
  assert.match(await v.page.locator('.tagline').textContent(), /unless you press Share/);
  await v.drop('snapshot.pickle', traceBytes('snapshot.pickle'));
  await v.overview.waitLoaded();
  // Copy link of a file from this computer: the link opens the view, not the file, and says so.
  await v.click('copy-link');
  assert.match(await v.text('share-note'), /not the trace: the file is on this computer only/);
  // Share asks before anything leaves the page; Cancel uploads nothing.
  const posts = [];
  v.page.on('request', (r) => { if (r.method() === 'POST') posts.push(r.url()); });
  await v.click('share');
  await v.el('share-ask').waitFor();
  assert.match(await v.text('share-ask'), /Upload snapshot\.pickle .* Anyone with the link can open it/);
  await v.click('share-cancel');
  await v.el('share-ask').waitFor({ state: 'detached' });
  assert.deepEqual(posts, [], 'nothing uploaded before the yes');
  const link = await v.share();
  assert.equal(posts.length, 1);
  const fresh = await launch();
  try {
    const other = await Viewer.open(fresh.ctx, link);
    await other.overview.expectReport(report('snapshot'));
    assert.deepEqual(other.errors, []);
  } finally {
    await fresh.close();
  }
});

test('a server that takes no uploads (gpucollect view, --max-upload 0) gets no Share button', async (ctx) => {
  const serve = await startServe(['--max-upload', '0']);
  try {
    const v = await Viewer.open(ctx, `${serve.url}?demo=training-leak`);
    await v.overview.waitLoaded();
    assert.equal(await v.count('share'), 0, 'no Share where it could only be refused');
    assert.equal(await v.count('copy-link'), 1, 'Copy link stays');
    // The same page from a server that takes uploads has it.
    const w = await Viewer.open(ctx, `${SERVE_URL}?demo=training-leak`);
    await w.overview.waitLoaded();
    assert.equal(await w.count('share'), 1);
  } finally {
    serve.stop();
  }
});
