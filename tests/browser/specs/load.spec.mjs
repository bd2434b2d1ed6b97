// Opening files: PyTorch snapshots and traces from a drop or the file dialog, the reading
// worker and its fallback to the page, the progress panel, and what a page holds before.
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
    // A file chosen before the worker runs is read on the page (the fallback); on a loaded
    // machine its script can take a while, so choose once it says it runs.
    await v.waitForReadWorker();
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
  // The viewer's own worker runs (it is started first).
  await v.waitForReadWorker();
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
    // As viewer/src/app/load.rs does: the last piece's buffer goes back before the next batch
    // is taken (acknowledged), so the worker has it to read into once it has room again.
    for (;;) {
      if (lent) w.postMessage({ id: 1, back: lent.buffer }, [lent.buffer]);
      lent = null;
      const m = await next();
      if (m.error) return { error: m.error };
      if (m.done) break;
      batches++;
      reuse = reuse && m.reuse === true;
      w.postMessage({ id: 1, ack: m.bufs.reduce((k, b) => k + b.byteLength, 0) });
      m.bufs.forEach((b, i) => {
        const view = b instanceof Uint8Array ? b : new Uint8Array(b);
        if (i > 0) w.postMessage({ id: 1, back: lent.buffer }, [lent.buffer]);
        out.set(view, at);
        at += view.byteLength;
        lent = view;
      });
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
  // 30 batches (64 KiB doubling to 4 MiB, then 4 MiB each) in at most 32 MiB in flight: the
  // 14 sent before anything is taken and the two read while the first are taken are new, and
  // every later one is read into a buffer handed back, however fast either side runs.
  const worker = page.workers().find((w) => !before.includes(w) && w.url().endsWith('read-worker.js'));
  assert.ok(worker, 'the test\'s worker is listed');
  const stats = await worker.evaluate(() => self.stats);
  assert.equal(got.batches, stats.buffers + stats.reused, JSON.stringify(stats));
  assert.ok(stats.reused >= 12 && stats.buffers <= 18, `buffers made and reused: ${JSON.stringify(stats)}`);
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
  // The worker has said it runs.
  await v.waitForReadWorker();
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
  await v.waitForReadWorker();
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

test('a page that has opened nothing holds nothing for a load: no hidden views, no grown memory, no read buffers', async (ctx) => {
  const v = await Viewer.open(ctx);
  await v.page.addInitScript(() => {
    addEventListener('TrunkApplicationStarted', (e) => {
      window.__wasm = e.detail.wasm;
      window.__startMemory = e.detail.wasm.memory.buffer.byteLength;
    });
    // Every element ever added to the page under the app (a view rendered out of sight too).
    window.__added = new Set();
    new MutationObserver((records) => {
      for (const r of records) for (const n of r.addedNodes) if (n.dataset?.testid) window.__added.add(n.dataset.testid);
    }).observe(document, { subtree: true, childList: true });
  });
  await v.goto(`${BASE}#view=timeline`);
  await v.waitForWelcome();
  await v.waitForReadWorker();
  // As long as a user may take to choose a file.
  await v.page.waitForTimeout(3000);
  const { start, now, added } = await v.page.evaluate(() => ({
    start: window.__startMemory, now: window.__wasm.memory.buffer.byteLength, added: [...window.__added],
  }));
  assert.equal(now, start, `the WebAssembly memory has not grown while idle: ${start} -> ${now} bytes`);
  assert.ok(now <= 64 * 2 ** 20, `WebAssembly memory at rest: ${now} bytes`);
  for (const id of ['view', 'timeline-canvas', 'overview', 'progress']) {
    assert.ok(!added.includes(id), `no ${id} rendered while nothing is open (${added})`);
  }
  const worker = v.page.workers().find((w) => w.url().endsWith('read-worker.js'));
  assert.ok(worker, 'the reading worker runs');
  const held = await worker.evaluate(() => spare.reduce((n, b) => n + b.byteLength, 0));
  assert.equal(held, 0, 'the reading worker holds no buffers before a file is chosen');
  assert.deepEqual(v.errors, []);
});

test('"Open trace…" works from the keyboard: Tab to it, Enter opens the file dialog', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  await v.waitForWelcome();
  // Listening for the dialog before the key is pressed: Playwright intercepts dialogs only once
  // a listener is registered, which takes a round trip to the browser.
  const chooser = v.page.waitForEvent('filechooser', { timeout: 10_000 });
  await v.page.bringToFront();
  assert.ok(await v.tabTo('file-picker', 10), `Tab reaches "Open trace…" (focus on ${await v.focused()})`);
  await v.page.keyboard.press('Enter');
  await (await chooser).setFiles(tracePath('spikes.msgpack'));
  await v.overview.expectReport(report('spikes'));
  assert.deepEqual(v.errors, []);
});
