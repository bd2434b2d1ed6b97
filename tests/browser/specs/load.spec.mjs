// Opening files: PyTorch snapshots and traces from a drop or the file dialog, the reading
// worker and its fallback to the page, the progress panel, and the idle warm-up.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { BASE, LOAD_TIMEOUT, report, spec, traceBytes, tracePath } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

test('a PyTorch memory snapshot dropped on the page opens like a trace', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  await v.waitForWelcome();
  await v.drop('snapshot.pickle', traceBytes('snapshot.pickle'));
  await v.overview.expectReport(report('snapshot'));
  await v.screenshot('pytorch-snapshot.png');
  assert.deepEqual(v.errors, []);
});

test('files of several MiB (a snapshot as pickle and as JSON, a trace) picked from the file dialog open with the report\'s numbers', async (ctx) => {
  // The JSON snapshot is the pickle's data: its report is the pickle's.
  for (const [name, expected] of [['big-snapshot.pickle', 'big-snapshot'], ['big-snapshot-as.json', 'big-snapshot'], ['big.msgpack', 'big']]) {
    const file = tracePath(name);
    assert.ok(fs.statSync(file).size > 3 * 1024 * 1024, `${name} spans several read slices`);
    const v = await Viewer.open(ctx, BASE);
    await v.pick(file);
    await v.overview.expectReport(report(expected));
    assert.deepEqual(v.errors, []);
    // Every slice was read by the worker (www/read-worker.js), none on the page's thread.
    const slices = await v.sliceReaders();
    assert.ok(slices.length >= 3, `several slices: ${slices}`);
    assert.ok(slices.every((n) => n === 'worker'), `read by the worker: ${slices}`);
  }
});

test('the reading worker streams a file in order, waits while 32 MiB are untaken, and reads into buffers handed back', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  const page = v.page;
  // The viewer's own worker runs once the warm-up is done (it is started first).
  await page.waitForSelector('html[data-warm="done"]', { state: 'attached', timeout: LOAD_TIMEOUT });
  const before = page.workers();
  // A worker of its own, driven as the viewer drives it (viewer/src/app/read_worker.rs).
  const got = await page.evaluate(async () => {
    const MiB = 1024 * 1024;
    const size = 100 * MiB + 12345;
    const bytes = new Uint8Array(size);
    for (let i = 0; i < size; i += 4096) bytes[i] = (i / 4096) % 251;
    bytes[size - 1] = 7;
    const blob = new Blob([bytes]);
    const w = new Worker('read-worker.js');
    const inbox = [];
    let wake = null;
    w.onmessage = ({ data }) => { inbox.push(data); if (wake) { wake(); wake = null; } };
    const next = async () => { while (!inbox.length) await new Promise((r) => { wake = r; }); return inbox.shift(); };
    if (!(await next()).ready) return { error: 'no ready message' };
    w.postMessage({ id: 1, blob, stream: true });
    // Nothing taken yet: the worker stops at 32 MiB untaken (it may finish the batch it read).
    await new Promise((r) => setTimeout(r, 500));
    const sentBeforeTaking = inbox.reduce((n, m) => n + (m.bufs || []).reduce((k, b) => k + b.byteLength, 0), 0);
    const out = new Uint8Array(size);
    let at = 0; let batches = 0; let lent = null; let reuse = true;
    for (;;) {
      const m = await next();
      if (m.error) return { error: m.error };
      if (m.done) break;
      batches++;
      reuse = reuse && m.reuse === true;
      w.postMessage({ id: 1, ack: m.bufs.reduce((k, b) => k + b.byteLength, 0) });
      for (const b of m.bufs) {
        const view = b instanceof Uint8Array ? b : new Uint8Array(b);
        if (lent) w.postMessage({ id: 1, back: lent.buffer }, [lent.buffer]);
        out.set(view, at);
        at += view.byteLength;
        lent = view;
      }
    }
    let same = at === size;
    for (let i = 0; same && i < size; i += 4096) same = out[i] === bytes[i];
    same = same && out[size - 1] === 7;
    return { same, at, batches, reuse, sentBeforeTaking };
  });
  assert.equal(got.error, undefined);
  assert.ok(got.same, `every byte, in order: ${JSON.stringify(got)}`);
  assert.ok(got.sentBeforeTaking >= 32 * 1024 * 1024 && got.sentBeforeTaking <= 36 * 1024 * 1024,
    `sent before anything was taken: ${got.sentBeforeTaking}`);
  // Chromium's file streams are byte streams: every batch is read into a buffer to hand back.
  assert.ok(got.reuse, 'batches ask for their buffers back');
  // 30 batches (64 KiB doubling to 4 MiB, then 4 MiB each) in at most 32 MiB in flight: most
  // of the 4 MiB ones are read into buffers handed back.
  const worker = page.workers().find((w) => !before.includes(w) && w.url().endsWith('read-worker.js'));
  assert.ok(worker, 'the test\'s worker is listed');
  const stats = await worker.evaluate(() => self.stats);
  assert.equal(got.batches, stats.buffers + stats.reused, JSON.stringify(stats));
  assert.ok(stats.reused >= 10 && stats.buffers <= 20, `buffers made and reused: ${JSON.stringify(stats)}`);
  await page.close();
});

test('a file whose reading worker fails part-way is read on by the page, with the same numbers', async (ctx) => {
  // A worker that hands over the file's first 100,003 bytes, then fails.
  const failing = `onmessage = async ({ data }) => {
    if (!data.stream) return;
    const buf = await data.blob.slice(0, 100003).arrayBuffer();
    postMessage({ id: data.id, bufs: [buf] }, [buf]);
    postMessage({ id: data.id, error: 'simulated failure' });
  };
  postMessage({ ready: true });`;
  const v = await Viewer.open(ctx);
  await v.page.route('**/read-worker.js', (route) => route.fulfill({ contentType: 'text/javascript', body: failing }));
  await v.goto(BASE);
  // The worker has said it runs once the warm-up is done (it is started first).
  await v.page.waitForSelector('html[data-warm="done"]', { state: 'attached', timeout: LOAD_TIMEOUT });
  await v.pick(tracePath('big-snapshot.pickle'));
  await v.overview.expectReport(report('big-snapshot'));
  const slices = await v.sliceReaders();
  assert.equal(slices[0], 'worker', `first by the worker: ${slices}`);
  assert.ok(slices.slice(1).length >= 1 && slices.slice(1).every((n) => n === 'page'), `then on the page: ${slices}`);
  assert.deepEqual(v.pageErrors, []);
});

test('progress: over the welcome screen only after 100 ms; over an open trace at once, without the welcome screen between', async (ctx) => {
  const v = await Viewer.open(ctx);
  const page = v.page;
  await page.addInitScript(() => {
    window.__seen = [];
    document.addEventListener('change', () => { window.__chosen = performance.now(); window.__seen = []; }, true);
    // When the progress panel, the welcome screen (shown) and the drawn timeline are seen.
    new MutationObserver(() => {
      if (!window.__chosen) return;
      const at = performance.now() - window.__chosen;
      const welcome = document.querySelector('[data-testid="welcome"]');
      const now = {
        progress: !!document.querySelector('[data-testid="progress"]'),
        welcome: !!welcome && !welcome.classList.contains('hidden'),
        drawn: !!document.querySelector('canvas[data-testid="timeline-canvas"][data-drawn-at]'),
      };
      for (const [k, v] of Object.entries(now)) if (v && !window.__seen.some((s) => s.what === k)) window.__seen.push({ what: k, at });
    }).observe(document, { subtree: true, childList: true, attributes: true });
  });
  await page.goto(`${BASE}#view=timeline`);
  await page.locator('html[data-warm="done"]').waitFor({ state: 'attached', timeout: LOAD_TIMEOUT });
  // A first load (a 60k-entry snapshot as 23 MB of JSON, most of a second in a debug build):
  // the progress, if the load lasts long enough to show it, comes after 100 ms, and a load that
  // lasts 250 ms or more shows it.
  await v.pick(tracePath('big-snapshot-as.json'));
  await v.timeline.waitShown({ drawn: true });
  let seen = await page.evaluate(() => window.__seen);
  const first = (what) => seen.find((s) => s.what === what);
  assert.ok(first('drawn'), JSON.stringify(seen));
  if (first('progress')) assert.ok(first('progress').at >= 95, `progress not before 100 ms: ${JSON.stringify(seen)}`);
  if (first('drawn').at >= 250) assert.ok(first('progress'), `a load of ${first('drawn').at} ms shows progress: ${JSON.stringify(seen)}`);
  // A second file over the open trace: the progress replaces its views at once, and the
  // welcome screen never shows in between.
  await v.pick(tracePath('spikes.msgpack'));
  await v.waitForSource('spikes.msgpack');
  seen = await page.evaluate(() => window.__seen);
  assert.ok(first('progress'), `progress over the open trace: ${JSON.stringify(seen)}`);
  assert.ok(!first('welcome'), `no welcome screen between two traces: ${JSON.stringify(seen)}`);
});

test('idle warm-up: invisible, leaves the page as it was, and a file chosen during it opens', async (ctx) => {
  const v = await Viewer.open(ctx);
  const page = v.page;
  await page.addInitScript(() => {
    addEventListener('TrunkApplicationStarted', (e) => { window.__wasm = e.detail.wasm; });
  });
  await page.goto(`${BASE}#view=timeline`);
  await page.locator('html[data-warm="done"]').waitFor({ state: 'attached', timeout: LOAD_TIMEOUT });
  // Nothing of the warm-up reached the document: still the welcome screen, no view, no progress.
  assert.ok(await page.locator('[data-testid="welcome"]').isVisible(), 'the welcome screen stays');
  for (const id of ['view', 'progress', 'error-panel', 'timeline-canvas']) {
    assert.equal(await v.count(id), 0, `no ${id} after the warm-up`);
  }
  assert.match(page.url(), /#view=timeline$/, 'the URL is unchanged');
  // The warm-up touched memory in advance (64 MiB at least) and freed it: a 60k-entry snapshot
  // then loads in that memory, without growing the WebAssembly heap.
  const heap = () => page.evaluate(() => window.__wasm.memory.buffer.byteLength);
  const warmHeap = await heap();
  assert.ok(warmHeap >= 64 * 2 ** 20, `memory touched in advance: ${warmHeap} bytes`);
  const analysed = () => page.evaluate(() => performance.getEntriesByName('gpucollect:analysed').length);
  const before = await analysed();
  await page.setInputFiles('[data-testid="file-picker"]', tracePath('big-snapshot.pickle'));
  await page.locator('[data-testid="source"]').filter({ hasText: 'big-snapshot.pickle' }).waitFor({ timeout: LOAD_TIMEOUT });
  // Until the detectors are done too.
  await page.waitForFunction((n) => performance.getEntriesByName('gpucollect:analysed').length > n, before, { timeout: LOAD_TIMEOUT });
  assert.equal(await heap(), warmHeap, 'the load used the memory touched in advance');
  // A file chosen while the warm-up runs stops it and opens normally.
  const early = (await Viewer.open(ctx, `${BASE}#view=timeline`)).page;
  await early.setInputFiles('[data-testid="file-picker"]', tracePath('spikes.msgpack'));
  await early.locator('[data-testid="timeline-canvas"][data-drawn-at]').waitFor({ timeout: LOAD_TIMEOUT });
  assert.equal(await early.locator('[data-testid="source"]').textContent(), 'spikes.msgpack');
  await early.waitForTimeout(500);
  assert.equal(await early.locator('html[data-warm]').count(), 0, 'the warm-up stopped when the file was chosen');
  // A page that opens a trace at start does not warm up.
  const demo = (await Viewer.open(ctx, `${BASE}?demo=spikes`)).page;
  await demo.locator('[data-testid="ov-peak"]').waitFor({ timeout: LOAD_TIMEOUT });
  await demo.waitForTimeout(500);
  assert.equal(await demo.locator('html[data-warm]').count(), 0, 'no warm-up next to a load at start');
});
