// Browser tests of the built viewer in headless Chromium.
// Run through scripts/test-browser.sh, which builds the app, writes the traces and their
// `gpucollect report --format json`, and serves them. Env: BASE_URL (the served app, with the
// traces under /traces/), TRACES (the same traces on disk), ARTIFACTS (screenshots).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { launch, fmtBytes, fmtDuration, dropFile } from './lib.mjs';

const BASE = process.env.BASE_URL;
const TRACES = process.env.TRACES;
const ARTIFACTS = process.env.ARTIFACTS || 'test-artifacts';
if (!BASE || !TRACES) {
  console.error('set BASE_URL and TRACES (scripts/test-browser.sh does)');
  process.exit(2);
}
fs.mkdirSync(ARTIFACTS, { recursive: true });
// Traces that scripts/test-browser.sh does not write are made here with the gpucollect it built.
const GPUCOLLECT = process.env.GPUCOLLECT
  || path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../target/debug/gpucollect');
for (const scenario of ['nvtx-leak']) {
  const trace = path.join(TRACES, `${scenario}.msgpack`);
  execFileSync(GPUCOLLECT, ['synth', scenario, '--events', '20000', '--seed', '5', '-o', trace], { stdio: 'ignore' });
  fs.writeFileSync(path.join(TRACES, `${scenario}.json`), execFileSync(GPUCOLLECT, ['report', trace, '--format', 'json']));
}
const report = (name) => JSON.parse(fs.readFileSync(path.join(TRACES, `${name}.json`), 'utf8'));
const traceBytes = (file) => fs.readFileSync(path.join(TRACES, file));
const LOAD_TIMEOUT = 60_000;

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

async function newPage(ctx, url) {
  const page = await ctx.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  page.errors = errors;
  if (url) await page.goto(url);
  return page;
}

const testid = (id) => `[data-testid="${id}"]`;
async function value(page, id) {
  return page.locator(testid(id)).first().getAttribute('data-value');
}
async function text(page, id) {
  return (await page.locator(testid(id)).first().textContent()).trim();
}

/** The overview numbers equal `gpucollect report --format json`, raw and formatted. */
async function checkOverview(page, r) {
  await page.locator(testid('ov-peak')).waitFor({ timeout: LOAD_TIMEOUT });
  const checks = [
    ['ov-peak', r.peak_bytes, fmtBytes],
    ['ov-live-end', r.live_at_end_bytes, fmtBytes],
    ['ov-duration', r.duration_nanos, fmtDuration],
    ['ov-peak-time', r.peak_ts_nanos - r.first_ts_nanos, fmtDuration],
    ['ov-allocs', r.alloc_count, String],
    ['ov-records', r.records, String],
    ['ov-live-end-count', r.live_at_end_count, String],
    ['ov-failed', r.failed_allocations.length, String],
  ];
  for (const [id, want, fmt] of checks) {
    assert.equal(await value(page, id), String(want), `${id} data-value`);
    assert.equal(await text(page, id), fmt(want), `${id} text`);
  }
  assert.equal(await value(page, 'ov-score'), String(r.score), 'score');
  const findings = await page.locator(testid('finding')).evaluateAll((els) => els.map((e) => [e.dataset.severity, e.dataset.kind, e.dataset.value]));
  assert.deepEqual(findings, r.findings.map((f) => [f.severity, f.kind, String(f.bytes)]), 'findings as in the report');
  const devPeaks = await page.locator(testid('device-peak')).evaluateAll((els) => els.map((e) => e.dataset.value));
  assert.deepEqual(devPeaks, r.devices.map((d) => String(d.peak_bytes)), 'per-device peaks');
}

async function visibleRange(page) {
  const el = page.locator(testid('visible-range'));
  return [BigInt(await el.getAttribute('data-t0')), BigInt(await el.getAttribute('data-t1'))];
}

async function waitForRangeChange(page, before) {
  await page.waitForFunction(([t0, t1]) => {
    const el = document.querySelector('[data-testid="visible-range"]');
    return el && (el.dataset.t0 !== t0 || el.dataset.t1 !== t1);
  }, [String(before[0]), String(before[1])]);
  return visibleRange(page);
}

test('drag and drop a trace: overview equals gpucollect report', async (ctx) => {
  const page = await newPage(ctx, BASE);
  await page.locator(testid('welcome')).waitFor();
  await dropFile(page, 'spikes.msgpack', traceBytes('spikes.msgpack'));
  await checkOverview(page, report('spikes'));
  assert.equal(await text(page, 'source'), 'spikes.msgpack');
  assert.equal(await page.locator(testid('error-panel')).count(), 0, 'no error panel for a good trace');
  await page.screenshot({ path: path.join(ARTIFACTS, 'overview.png'), fullPage: true });
  assert.deepEqual(page.errors, []);
});

test('?trace=URL loads, every view renders, screenshots', async (ctx) => {
  const page = await newPage(ctx, `${BASE}?trace=traces/multi-device.msgpack`);
  await checkOverview(page, report('multi-device'));
  for (const view of ['timeline', 'leaks', 'spikes', 'fragmentation', 'sites', 'overview']) {
    await page.click(testid(`tab-${view}`));
    await page.locator(`main[data-view="${view}"]`).waitFor();
    await page.waitForTimeout(200);
    await page.screenshot({ path: path.join(ARTIFACTS, `view-${view}.png`), fullPage: true });
  }
  // Several devices: the device selector exists and narrows the timeline.
  assert.ok(await page.locator(testid('filter-device')).count(), 'device selector');
  assert.deepEqual(page.errors, []);
});

test('call sites: sums match the report, search and sort work', async (ctx) => {
  const r = report('spikes');
  const page = await newPage(ctx, `${BASE}?trace=traces/spikes.msgpack#view=sites`);
  await page.locator(testid('sites-table')).waitFor({ timeout: LOAD_TIMEOUT });
  const all = Number(await value(page, 'sites-count'));
  assert.ok(all >= 3, `call sites: ${all}`);
  const top = r.peak_sites[0];
  await page.click(testid('sort-peak'));
  const firstRow = page.locator(testid('site-row')).first();
  assert.equal(await firstRow.getAttribute('data-stack'), String(top.stack), 'largest contribution to the peak first');
  // CSV export of the table: a header and one line per call site.
  const [csvDownload] = await Promise.all([page.waitForEvent('download'), page.click(testid('export-csv'))]);
  const csv = fs.readFileSync(await csvDownload.path(), 'utf8').trim().split('\r\n');
  assert.equal(csv[0], 'site,allocated_bytes,allocations,at_peak_bytes,live_at_end_bytes,max_size_bytes,stack');
  assert.equal(csv.length - 1, all, 'one CSV line per call site');
  await page.fill(testid('site-search'), 'attention_scores');
  await page.waitForFunction((n) => Number(document.querySelector('[data-testid="sites-count"]').dataset.value) < n, all);
  assert.match(await page.locator(testid('site-row')).first().textContent(), /attention_scores/);
});

test('timeline: zoom (button, wheel, keys, brush) changes the visible range; hover and pin', async (ctx) => {
  const page = await newPage(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const canvas = page.locator(testid('timeline-canvas'));
  await canvas.waitFor({ timeout: LOAD_TIMEOUT });
  const r0 = await visibleRange(page);
  await page.click(testid('zoom-in'));
  const r1 = await waitForRangeChange(page, r0);
  assert.ok(r1[1] - r1[0] < r0[1] - r0[0], `zoom-in narrows ${r0} -> ${r1}`);
  const box = await canvas.boundingBox();
  await page.mouse.move(box.x + box.width * 0.6, box.y + box.height * 0.5);
  await page.mouse.wheel(0, -300);
  const r2 = await waitForRangeChange(page, r1);
  assert.ok(r2[1] - r2[0] < r1[1] - r1[0], 'wheel up zooms in');
  await page.keyboard.press('ArrowRight');
  const r3 = await waitForRangeChange(page, r2);
  assert.equal(r3[1] - r3[0], r2[1] - r2[0], 'pan keeps the width');
  assert.ok(r3[0] > r2[0], 'ArrowRight pans right');
  await page.keyboard.press('0');
  const r4 = await waitForRangeChange(page, r3);
  assert.deepEqual(r4, r0, 'reset shows the whole trace');
  // Brush: drag across the middle fifth.
  const y = box.y + box.height * 0.6;
  await page.mouse.move(box.x + box.width * 0.4, y);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.5, y, { steps: 5 });
  await page.mouse.move(box.x + box.width * 0.6, y, { steps: 5 });
  await page.mouse.up();
  const r5 = await waitForRangeChange(page, r4);
  assert.ok(r5[1] - r5[0] < (r4[1] - r4[0]) / 3n, 'brush selects a narrower window');
  // Hover shows time, bytes and the call sites live then.
  await page.mouse.move(box.x + box.width * 0.5, y);
  const tip = page.locator(testid('hover-tip'));
  await tip.waitFor();
  assert.match(await tip.textContent(), /(B|KiB|MiB|GiB) live/);
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="hover-tip"] li').length > 0);
  // Click pins the moment and lists live allocations by stack.
  await page.mouse.click(box.x + box.width * 0.5, y);
  await page.locator(testid('pinned')).waitFor();
  const pinnedTs = await page.locator(testid('pinned')).getAttribute('data-ts');
  assert.ok(Number(pinnedTs) >= Number(r5[0]) && Number(pinnedTs) <= Number(r5[1]), 'pin inside the window');
  await page.screenshot({ path: path.join(ARTIFACTS, 'timeline-zoomed.png'), fullPage: true });
  // Chart exports: SVG from the plotters SVG backend, PNG from the canvas.
  const [svgDownload] = await Promise.all([page.waitForEvent('download'), page.click(testid('export-svg'))]);
  const svg = fs.readFileSync(await svgDownload.path(), 'utf8');
  assert.match(svg, /^<svg/);
  assert.match(svg, /process 0 · GPU 0/);
  const [pngDownload] = await Promise.all([page.waitForEvent('download'), page.click(testid('export-png'))]);
  assert.deepEqual([...fs.readFileSync(await pngDownload.path()).subarray(1, 4)], [0x50, 0x4e, 0x47]);
  // Dark theme follows the system.
  await page.emulateMedia({ colorScheme: 'dark' });
  await page.keyboard.press('-');
  await page.waitForTimeout(200);
  await page.screenshot({ path: path.join(ARTIFACTS, 'timeline-dark.png'), fullPage: true });
  assert.deepEqual(page.errors, []);
});

test('a copied link reopens the same view', async (ctx) => {
  const page = await newPage(ctx, `${BASE}?trace=traces/multi-device.msgpack`);
  await page.locator(testid('ov-peak')).waitFor({ timeout: LOAD_TIMEOUT });
  await page.click(testid('tab-timeline'));
  await page.click(testid('zoom-in'));
  await page.click(testid('zoom-in'));
  await page.click(testid('pan-right'));
  await page.selectOption(testid('filter-device'), { index: 2 });
  const canvas = page.locator(testid('timeline-canvas'));
  const box = await canvas.boundingBox();
  await page.mouse.click(box.x + box.width * 0.5, box.y + box.height * 0.5);
  await page.locator(testid('pinned')).waitFor();
  const range = await visibleRange(page);
  const pin = await page.locator(testid('pinned')).getAttribute('data-ts');
  const device = await page.locator(testid('filter-device')).inputValue();
  await page.click(testid('copy-link'));
  const link = await page.locator(testid('share-link')).inputValue();
  assert.match(link, /\?trace=.*#view=timeline&t0=\d+&t1=\d+&pin=\d+&device=\d+/);
  const again = await newPage(ctx, link);
  await again.locator(testid('timeline-canvas')).waitFor({ timeout: LOAD_TIMEOUT });
  assert.equal(await again.locator('main').getAttribute('data-view'), 'timeline');
  assert.deepEqual(await visibleRange(again), range);
  assert.equal(await again.locator(testid('pinned')).getAttribute('data-ts'), pin);
  assert.equal(await again.locator(testid('filter-device')).inputValue(), device);
  await again.close();
});

test('bad files show the error panel and keep what decoded', async (ctx) => {
  const page = await newPage(ctx, BASE);
  await page.locator(testid('welcome')).waitFor();
  await dropFile(page, 'notes.txt', Buffer.from('these are not the bytes you are looking for\n'.repeat(50)));
  await page.locator(testid('error-panel')).waitFor({ timeout: LOAD_TIMEOUT });
  assert.match(await text(page, 'error-message'), /not a gpucollect trace/);
  await page.screenshot({ path: path.join(ARTIFACTS, 'error-not-a-trace.png') });

  await dropFile(page, 'newer.msgpack', traceBytes('newer.msgpack'));
  await page.waitForFunction(() => /format version 2\./.test(document.querySelector('[data-testid="error-message"]')?.textContent || ''));

  await dropFile(page, 'truncated.msgpack', traceBytes('truncated.msgpack'));
  await page.locator(testid('ov-peak')).waitFor({ timeout: LOAD_TIMEOUT });
  await page.locator(testid('error-panel')).waitFor();
  assert.match(await page.locator(testid('error-panel')).textContent(), /truncated|no end record/);
  const r = report('truncated');
  assert.equal(await value(page, 'ov-records'), String(r.records), 'the decoded part is kept');
  assert.equal(await value(page, 'ov-peak'), String(r.peak_bytes));
  await page.screenshot({ path: path.join(ARTIFACTS, 'error-truncated.png'), fullPage: true });

  const missing = await newPage(ctx, `${BASE}?trace=traces/missing.msgpack`);
  await missing.locator(testid('error-panel')).waitFor({ timeout: LOAD_TIMEOUT });
  assert.match(await text(missing, 'error-message'), /404.*traces\/missing\.msgpack/);
});

test('demos load without a trace; embed mode hides the chrome', async (ctx) => {
  const page = await newPage(ctx, BASE);
  await page.click(testid('demo-oom'));
  await page.locator(testid('ov-peak')).waitFor({ timeout: LOAD_TIMEOUT });
  assert.ok(Number(await value(page, 'ov-failed')) > 0, 'the OOM demo has failed allocations');
  assert.match(page.url(), /\?demo=oom/);
  await page.click(testid('tab-fragmentation'));
  assert.ok(await page.locator(testid('oom-row')).count() > 0);
  await page.screenshot({ path: path.join(ARTIFACTS, 'demo-oom-fragmentation.png'), fullPage: true });
  const embed = await newPage(ctx, `${BASE}?trace=traces/spikes.msgpack&embed=1#view=timeline`);
  await embed.locator(testid('timeline-canvas')).waitFor({ timeout: LOAD_TIMEOUT });
  assert.equal(await embed.locator(testid('file-picker-label')).count(), 0, 'no header in embed mode');
  await embed.screenshot({ path: path.join(ARTIFACTS, 'embed-timeline.png') });
});

test('idle warm-up: invisible, leaves the page as it was, and a file chosen during it opens', async (ctx) => {
  const page = await newPage(ctx);
  await page.addInitScript(() => {
    addEventListener('TrunkApplicationStarted', (e) => { window.__wasm = e.detail.wasm; });
  });
  await page.goto(`${BASE}#view=timeline`);
  await page.locator('html[data-warm="done"]').waitFor({ state: 'attached', timeout: LOAD_TIMEOUT });
  // Nothing of the warm-up reached the document: still the welcome screen, no view, no progress.
  assert.ok(await page.locator(testid('welcome')).isVisible(), 'the welcome screen stays');
  for (const id of ['view', 'progress', 'error-panel', 'timeline-canvas']) {
    assert.equal(await page.locator(testid(id)).count(), 0, `no ${id} after the warm-up`);
  }
  assert.match(page.url(), /#view=timeline$/, 'the URL is unchanged');
  // The warm-up touched memory in advance (64 MiB at least) and freed it: a 60k-entry snapshot
  // then loads in that memory, without growing the WebAssembly heap.
  const heap = () => page.evaluate(() => window.__wasm.memory.buffer.byteLength);
  const warmHeap = await heap();
  assert.ok(warmHeap >= 64 * 2 ** 20, `memory touched in advance: ${warmHeap} bytes`);
  const analysed = () => page.evaluate(() => performance.getEntriesByName('gpucollect:analysed').length);
  const before = await analysed();
  await page.setInputFiles(testid('file-picker'), path.join(TRACES, 'big-snapshot.pickle'));
  await page.locator(testid('source')).filter({ hasText: 'big-snapshot.pickle' }).waitFor({ timeout: LOAD_TIMEOUT });
  // Until the detectors are done too.
  await page.waitForFunction((n) => performance.getEntriesByName('gpucollect:analysed').length > n, before, { timeout: LOAD_TIMEOUT });
  assert.equal(await heap(), warmHeap, 'the load used the memory touched in advance');
  // A file chosen while the warm-up runs stops it and opens normally.
  const early = await newPage(ctx, `${BASE}#view=timeline`);
  await early.setInputFiles(testid('file-picker'), path.join(TRACES, 'spikes.msgpack'));
  await early.locator(`${testid('timeline-canvas')}[data-drawn-at]`).waitFor({ timeout: LOAD_TIMEOUT });
  assert.equal(await early.locator(testid('source')).textContent(), 'spikes.msgpack');
  await early.waitForTimeout(500);
  assert.equal(await early.locator('html[data-warm]').count(), 0, 'the warm-up stopped when the file was chosen');
  // A page that opens a trace at start does not warm up.
  const demo = await newPage(ctx, `${BASE}?demo=spikes`);
  await demo.locator(testid('ov-peak')).waitFor({ timeout: LOAD_TIMEOUT });
  await demo.waitForTimeout(500);
  assert.equal(await demo.locator('html[data-warm]').count(), 0, 'no warm-up next to a load at start');
});

test('progress: over the welcome screen only after 100 ms; over an open trace at once, without the welcome screen between', async (ctx) => {
  const page = await newPage(ctx);
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
  await page.setInputFiles(testid('file-picker'), path.join(TRACES, 'big-snapshot-as.json'));
  await page.locator(`${testid('timeline-canvas')}[data-drawn-at]`).waitFor({ timeout: LOAD_TIMEOUT });
  let seen = await page.evaluate(() => window.__seen);
  const first = (what) => seen.find((s) => s.what === what);
  assert.ok(first('drawn'), JSON.stringify(seen));
  if (first('progress')) assert.ok(first('progress').at >= 95, `progress not before 100 ms: ${JSON.stringify(seen)}`);
  if (first('drawn').at >= 250) assert.ok(first('progress'), `a load of ${first('drawn').at} ms shows progress: ${JSON.stringify(seen)}`);
  // A second file over the open trace: the progress replaces its views at once, and the
  // welcome screen never shows in between.
  await page.setInputFiles(testid('file-picker'), path.join(TRACES, 'spikes.msgpack'));
  await page.locator(testid('source')).filter({ hasText: 'spikes.msgpack' }).waitFor({ timeout: LOAD_TIMEOUT });
  seen = await page.evaluate(() => window.__seen);
  assert.ok(first('progress'), `progress over the open trace: ${JSON.stringify(seen)}`);
  assert.ok(!first('welcome'), `no welcome screen between two traces: ${JSON.stringify(seen)}`);
});

test('the timeline is drawn before the detectors run; their markers and views follow', async (ctx) => {
  const spikes = report('spikes').analysis.timeline_spikes;
  const page = await newPage(ctx);
  await page.addInitScript(() => {
    window.__draws = [];
    new MutationObserver((records) => {
      for (const r of records) {
        if (r.target.dataset?.testid === 'timeline-canvas') window.__draws.push(Number(r.target.dataset.drawnAt));
      }
    }).observe(document, { attributes: true, attributeFilter: ['data-drawn-at'], subtree: true });
  });
  await page.goto(`${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const marker = `${testid('marker-list')} ${testid('marker')}[data-kind="spike"]`;
  await page.locator(marker).first().waitFor({ state: 'attached', timeout: LOAD_TIMEOUT });
  assert.equal(await page.locator(marker).count(), spikes.length, 'the markers arrive with the detectors');
  // The markers' list is rendered at once; the canvas is redrawn with them in the next animation
  // frame, so wait for that draw (the assertion below fails if it never comes).
  await page.waitForFunction(() => {
    const at = performance.getEntriesByName('gpucollect:analysed')[0]?.startTime;
    return at !== undefined && window.__draws.some((d) => d > at);
  }, null, { timeout: 10_000 }).catch(() => {});
  const { draws, analysed } = await page.evaluate(() => ({
    draws: window.__draws,
    analysed: performance.getEntriesByName('gpucollect:analysed').map((m) => m.startTime),
  }));
  assert.equal(analysed.length, 1, 'the detectors ran once');
  assert.ok(draws[0] < analysed[0], `first draw ${draws[0]} before the detectors ${analysed[0]}`);
  assert.ok(draws.some((d) => d > analysed[0]), 'redrawn with the markers afterwards');
  // The views built on the report show it (the note while detecting is gone).
  await page.click(testid('tab-overview'));
  await page.locator(testid('ov-peak')).waitFor();
  assert.equal(await page.locator(testid('detecting')).count(), 0);
  assert.deepEqual(page.errors, []);
});

test('leaks: live-at-end sites add up and rows expand to a growth chart and stack', async (ctx) => {
  const r = report('multi-device');
  assert.ok(r.live_at_end_bytes > 0, 'the multi-device trace leaves memory live');
  const page = await newPage(ctx, `${BASE}?trace=traces/multi-device.msgpack#view=leaks`);
  await page.locator(testid('leaks-table')).waitFor({ timeout: LOAD_TIMEOUT });
  const live = await page.locator(testid('leak-live')).evaluateAll((els) => els.reduce((s, e) => s + Number(e.dataset.value), 0));
  assert.equal(live, r.live_at_end_bytes);
  // The device selector narrows the table to that device's live memory.
  const sumLive = () => page.locator(testid('leak-live')).evaluateAll((els) => els.reduce((s, e) => s + Number(e.dataset.value), 0));
  for (const d of r.devices) {
    await page.selectOption(testid('filter-device'), String(d.device));
    await page.waitForFunction(([n]) => document.querySelectorAll('[data-testid="leak-row"]').length === n || n < 0,
      [d.live_at_end_bytes === 0 ? 0 : -1]);
    await page.waitForTimeout(100);
    assert.equal(await sumLive(), d.live_at_end_bytes, `live at end on GPU ${d.device}`);
  }
  await page.selectOption(testid('filter-device'), 'all');
  await page.waitForFunction((n) => document.querySelectorAll('[data-testid="leak-row"]').length >= n, 1);
  await page.locator(testid('leak-row')).first().click();
  await page.locator(testid('leak-detail')).waitFor();
  assert.ok(await page.locator(`${testid('leak-detail')} ${testid('stack')} li`).count() > 0);
  await page.screenshot({ path: path.join(ARTIFACTS, 'leaks-expanded.png'), fullPage: true });
});

/** The severity the report gives a scope: a leak found in it, or its growth finding or note. */
const SCOPE_KINDS = ['scope_growth', 'bounded_growth', 'leak_growth', 'leak_at_exit', 'missed_free', 'thread_exit_leak'];
function scopeSeverity(r, scope) {
  const order = ['info', 'warning', 'critical'];
  const sevs = [...r.findings, ...r.notes]
    .filter((f) => SCOPE_KINDS.includes(f.kind) && f.scope === scope)
    .map((f) => f.severity);
  return sevs.length ? sevs.sort((a, b) => order.indexOf(b) - order.indexOf(a))[0] : 'none';
}

test('leaks: the scope table equals the report (growth, per call, calls, severity), sorts, exports, expands', async (ctx) => {
  const r = report('nvtx-leak');
  const scopes = r.analysis.scopes;
  assert.ok(scopes.length >= 2, 'the nvtx-leak trace has several scopes');
  const page = await newPage(ctx, `${BASE}?trace=traces/nvtx-leak.msgpack#view=leaks`);
  await page.locator(testid('scopes-table')).waitFor({ timeout: LOAD_TIMEOUT });
  const rows = () => page.locator(testid('scope-row')).evaluateAll((els) => els.map((e) => ({ ...e.dataset, text: e.textContent })));
  const shown = await rows();
  assert.equal(shown.length, scopes.length, 'one row per scope');
  shown.forEach((row, i) => {
    const s = scopes[i];
    assert.equal(row.scope, s.scope, 'report order: largest growth first');
    assert.equal(Number(row.total), s.total_growth_bytes, `${s.scope} total growth`);
    assert.equal(Number(row.avg), s.avg_growth_bytes, `${s.scope} growth per call`);
    assert.equal(Number(row.calls), s.calls, `${s.scope} calls`);
    assert.equal(row.reference, String(s.reference_leak), `${s.scope} reference rule`);
    assert.equal(row.growth, s.total_growth_bytes <= 0 ? 'none' : s.bounded ? 'bounded' : 'unbounded');
    assert.equal(row.severity, scopeSeverity(r, s.scope), `${s.scope} severity`);
    const sign = s.total_growth_bytes < 0 ? '-' : '+';
    assert.ok(row.text.includes(`${sign}${fmtBytes(Math.abs(s.total_growth_bytes))}`), `${s.scope} total shown as in the CLI`);
  });
  const flagged = scopes.find((s) => s.reference_leak && !s.explained_by);
  assert.ok(flagged, 'the report flags a scope');
  assert.notEqual(scopeSeverity(r, flagged.scope), 'none');
  // Sorting: calls, descending then ascending; severity puts the flagged scope first.
  await page.click(testid('scope-sort-calls'));
  let calls = (await rows()).map((x) => Number(x.calls));
  assert.deepEqual(calls, [...calls].sort((a, b) => b - a), 'calls descending');
  await page.click(testid('scope-sort-calls'));
  await page.waitForFunction(() => document.querySelector('[data-testid="scope-sort-calls"]').closest('th').getAttribute('aria-sort') === 'ascending');
  calls = (await rows()).map((x) => Number(x.calls));
  assert.deepEqual(calls, [...calls].sort((a, b) => a - b), 'calls ascending');
  await page.click(testid('scope-sort-severity'));
  assert.equal((await rows())[0].scope, flagged.scope, 'most severe first');
  // CSV export of the scope table.
  const [csvDownload] = await Promise.all([page.waitForEvent('download'),
    page.click(`${testid('scopes-section')} ${testid('export-csv')}`)]);
  const csv = fs.readFileSync(await csvDownload.path(), 'utf8').trim().split('\r\n');
  assert.match(csv[0], /^scope,kind,severity,total_growth_bytes,avg_growth_bytes,calls,/);
  assert.equal(csv.length - 1, scopes.length, 'one CSV line per scope');
  assert.ok(csv.some((l) => l.startsWith(`${flagged.scope},NVTX range,${scopeSeverity(r, flagged.scope)},${flagged.total_growth_bytes},`)));
  // The flagged row expands to its growth chart and the stack that kept the bytes.
  await page.click(`[data-testid="scope-row"][data-scope="${flagged.scope}"]`);
  const detail = page.locator(testid('scope-detail'));
  await detail.waitFor();
  await detail.locator('canvas[data-testid="chart-scope-growth"]').waitFor();
  assert.equal(await detail.locator(testid('scope-top-bytes')).getAttribute('data-value'), String(flagged.top_site_bytes));
  assert.ok(await detail.locator(`${testid('stack')} li`).count() > 0, 'full stack');
  assert.equal(await page.locator(`[data-testid="scope-row"][data-scope="${flagged.scope}"] button`).getAttribute('aria-expanded'), 'true');
  // The live-at-end table is still there, below.
  assert.ok(await page.locator(testid('leak-row')).count() > 0);
  await page.screenshot({ path: path.join(ARTIFACTS, 'leaks-scopes.png'), fullPage: true });
  assert.deepEqual(page.errors, []);
});

test('spikes: the report\'s detected spikes are listed and marked on the timeline', async (ctx) => {
  const r = report('spikes');
  const spikes = r.analysis.timeline_spikes;
  assert.ok(spikes.length > 0, 'the spikes trace has timeline spikes');
  const page = await newPage(ctx, `${BASE}?trace=traces/spikes.msgpack#view=spikes`);
  await page.locator(testid('detected-spikes-table')).waitFor({ timeout: LOAD_TIMEOUT });
  const rows = await page.locator(testid('detected-spike-row')).evaluateAll((els) => els.map((e) => ({ ...e.dataset })));
  const keys = new Set([
    ...spikes.map((s) => `${s.ts_nanos}:${s.stack}`),
    ...r.analysis.scope_spikes.flatMap((sc) => sc.events.map((e) => `${e.ts_nanos}:${e.stack}`)),
  ]);
  assert.equal(rows.length, keys.size, 'one row per detected spike');
  for (const s of spikes) {
    const row = rows.find((x) => x.ts === String(s.ts_nanos));
    assert.ok(row, `spike at ${s.ts_nanos} listed`);
    assert.deepEqual([row.size, row.live, row.timeline], [String(s.size_bytes), String(s.live_bytes), 'true']);
  }
  // On the timeline: one spike marker per detected spike, and the labels in the SVG export.
  await page.click(testid('tab-timeline'));
  await page.locator(testid('timeline-canvas')).waitFor();
  const marked = await page.locator(`${testid('marker-list')} ${testid('marker')}[data-kind="spike"]`)
    .evaluateAll((els) => els.map((e) => e.dataset.ts));
  assert.deepEqual(new Set(marked), new Set(rows.map((x) => x.ts)), 'a marker per detected spike');
  const [svgDownload] = await Promise.all([page.waitForEvent('download'), page.click(testid('export-svg'))]);
  const svg = fs.readFileSync(await svgDownload.path(), 'utf8');
  assert.ok(svg.includes(`spike ${fmtBytes(spikes[0].size_bytes)}`), 'spike markers are drawn with their size');
  // A row zooms the timeline on its spike.
  await page.click(testid('tab-spikes'));
  await page.locator(testid('detected-spike-row')).first().click();
  await page.locator(testid('timeline-canvas')).waitFor();
  const [t0, t1] = await visibleRange(page);
  const first = BigInt(rows[0].ts);
  assert.ok(t0 <= first && first <= t1, 'the window holds the spike');
  await page.screenshot({ path: path.join(ARTIFACTS, 'timeline-spike.png'), fullPage: true });
  assert.deepEqual(page.errors, []);
});

test('HiDPI: the chart is drawn at the device pixel ratio and still maps the mouse', async () => {
  const hidpi = await launch({ deviceScaleFactor: 2 });
  try {
    const page = await newPage(hidpi.ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
    const canvas = page.locator(testid('timeline-canvas'));
    await canvas.waitFor({ timeout: LOAD_TIMEOUT });
    await page.waitForSelector('canvas[data-testid="timeline-canvas"][data-drawn-at]');
    const [w, h, cssW, cssH] = await canvas.evaluate((c) => [c.width, c.height, c.clientWidth, c.clientHeight]);
    assert.deepEqual([w, h], [cssW * 2, cssH * 2], 'backing store = CSS size x 2');
    const [pngDownload] = await Promise.all([page.waitForEvent('download'), page.click(testid('export-png'))]);
    const png = fs.readFileSync(await pngDownload.path());
    assert.deepEqual([png.readUInt32BE(16), png.readUInt32BE(20)], [w, h], 'PNG at full resolution');
    // A click at the middle of the plot pins a moment inside the visible window.
    const box = await canvas.boundingBox();
    await page.mouse.click(box.x + box.width * 0.5, box.y + box.height * 0.5);
    await page.locator(testid('pinned')).waitFor();
    const pinned = BigInt(await page.locator(testid('pinned')).getAttribute('data-ts'));
    const [t0, t1] = await visibleRange(page);
    const mid = t0 + (t1 - t0) / 2n;
    const tolerance = (t1 - t0) / 10n;
    assert.ok(pinned > mid - tolerance && pinned < mid + tolerance, 'the pin lands where the mouse is');
    await page.screenshot({ path: path.join(ARTIFACTS, 'timeline-hidpi.png') });
    assert.deepEqual(page.errors, []);
  } finally {
    await hidpi.close();
  }
});

test('a PyTorch memory snapshot dropped on the page opens like a trace', async (ctx) => {
  const page = await newPage(ctx, BASE);
  await page.locator(testid('welcome')).waitFor();
  await dropFile(page, 'snapshot.pickle', traceBytes('snapshot.pickle'));
  await checkOverview(page, report('snapshot'));
  await page.screenshot({ path: path.join(ARTIFACTS, 'pytorch-snapshot.png'), fullPage: true });
  assert.deepEqual(page.errors, []);
});

test('files of several MiB (a snapshot as pickle and as JSON, a trace) picked from the file dialog open with the report\'s numbers', async (ctx) => {
  // The JSON snapshot is the pickle's data: its report is the pickle's.
  for (const [name, expected] of [['big-snapshot.pickle', 'big-snapshot'], ['big-snapshot-as.json', 'big-snapshot'], ['big.msgpack', 'big']]) {
    const file = path.join(TRACES, name);
    assert.ok(fs.statSync(file).size > 3 * 1024 * 1024, `${name} spans several read slices`);
    const page = await newPage(ctx, BASE);
    await page.setInputFiles(testid('file-picker'), file);
    await checkOverview(page, report(expected));
    assert.deepEqual(page.errors, []);
    // Every slice was read by the worker (www/read-worker.js), none on the page's thread.
    const slices = await page.evaluate(() => performance.getEntriesByType('mark').map((m) => m.name)
      .filter((n) => n.startsWith('gpucollect:slice-read-by-')));
    assert.ok(slices.length >= 3, `several slices: ${slices}`);
    assert.ok(slices.every((n) => n.endsWith('worker')), `read by the worker: ${slices}`);
  }
});

test('the reading worker streams a file in order, waits while 32 MiB are untaken, and reads into buffers handed back', async (ctx) => {
  const page = await newPage(ctx, BASE);
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
  const page = await ctx.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.route('**/read-worker.js', (route) => route.fulfill({ contentType: 'text/javascript', body: failing }));
  await page.goto(BASE);
  // The worker has said it runs once the warm-up is done (it is started first).
  await page.waitForSelector('html[data-warm="done"]', { state: 'attached', timeout: LOAD_TIMEOUT });
  await page.setInputFiles(testid('file-picker'), path.join(TRACES, 'big-snapshot.pickle'));
  await checkOverview(page, report('big-snapshot'));
  const slices = await page.evaluate(() => performance.getEntriesByType('mark').map((m) => m.name)
    .filter((n) => n.startsWith('gpucollect:slice-read-by-')));
  assert.equal(slices[0], 'gpucollect:slice-read-by-worker', `first by the worker: ${slices}`);
  assert.ok(slices.slice(1).length >= 1 && slices.slice(1).every((n) => n.endsWith('page')), `then on the page: ${slices}`);
  assert.deepEqual(errors, []);
  await page.close();
});

test('when the WebAssembly stops (a trap, as when its memory is full), the page says so and what to do', async (ctx) => {
  const page = await newPage(ctx, BASE);
  await page.locator(testid('welcome')).waitFor();
  // Another page error is not the viewer stopping.
  await page.evaluate(() => setTimeout(() => { throw new Error('not the viewer'); }));
  await page.waitForTimeout(200);
  assert.equal(await page.locator(testid('fatal-error')).count(), 0);
  // What a failed allocation in the WebAssembly throws (an abort: `unreachable`), uncaught.
  await page.evaluate(() => setTimeout(() => { throw new WebAssembly.RuntimeError('unreachable'); }));
  const box = page.locator(testid('fatal-error'));
  await box.waitFor();
  const said = await box.textContent();
  for (const part of ['The viewer stopped', 'unreachable', '4 GiB', 'Reload the page', 'gpucollect report']) {
    assert.ok(said.includes(part), `says ${part}: ${said}`);
  }
  await page.screenshot({ path: path.join(ARTIFACTS, 'viewer-stopped.png') });
});

test('gpucollect html: the single-file report opens offline with the same numbers', async () => {
  const offline = await launch();
  try {
    // No network at all: every http(s) request fails.
    await offline.ctx.route(/^https?:/, (route) => route.abort());
    const page = await newPage(offline.ctx, `file://${path.join(TRACES, 'report.html')}`);
    await checkOverview(page, report('spikes'));
    // A file opened there is read without the worker (no worker script next to the report).
    await page.setInputFiles(testid('file-picker'), path.join(TRACES, 'big-snapshot.pickle'));
    await page.locator(testid('source')).filter({ hasText: 'big-snapshot.pickle' }).waitFor({ timeout: LOAD_TIMEOUT });
    await checkOverview(page, report('big-snapshot'));
    const slices = await page.evaluate(() => performance.getEntriesByType('mark').map((m) => m.name)
      .filter((n) => n.startsWith('gpucollect:slice-read-by-')));
    assert.ok(slices.length >= 3 && slices.every((n) => n.endsWith('page')), `read on the page: ${slices}`);
    await page.goto(`file://${path.join(TRACES, 'report.html')}`);
    await checkOverview(page, report('spikes'));
    await page.screenshot({ path: path.join(ARTIFACTS, 'single-file-report.png'), fullPage: true });
    // A PyTorch snapshot's single-file report: the embedded trace has the snapshot's numbers.
    await page.goto(`file://${path.join(TRACES, 'snapshot-report.html')}`);
    await page.locator(testid('source')).filter({ hasText: 'embedded trace' }).waitFor({ timeout: LOAD_TIMEOUT });
    await checkOverview(page, report('big-snapshot'));
  } finally {
    await offline.close();
  }
});

test('Share uploads to gpucollect serve; the link opens the same view in a fresh browser', async (ctx) => {
  const SERVE = process.env.SERVE_URL;
  assert.ok(SERVE, 'SERVE_URL is set by scripts/test-browser.sh');
  const page = await newPage(ctx, SERVE);
  await page.locator(testid('welcome')).waitFor({ timeout: LOAD_TIMEOUT });
  await dropFile(page, 'multi-device.msgpack', traceBytes('multi-device.msgpack'));
  await page.locator(testid('ov-peak')).waitFor({ timeout: LOAD_TIMEOUT });
  await page.click(testid('tab-sites'));
  await page.click(testid('share'));
  await page.waitForFunction(() => {
    const el = document.querySelector('[data-testid="share-link"]');
    return el && /^https?:\/\/.*\/t\/[0-9a-f]{32}#/.test(el.value);
  }, null, { timeout: LOAD_TIMEOUT });
  const link = await page.locator(testid('share-link')).inputValue();
  assert.match(link, /view=sites/, link);
  const fresh = await launch();
  try {
    const other = await newPage(fresh.ctx, link);
    await other.locator(`${testid('tab-sites')}[aria-selected="true"]`).waitFor({ timeout: LOAD_TIMEOUT });
    await other.screenshot({ path: path.join(ARTIFACTS, 'shared-link-fresh-profile.png'), fullPage: true });
    await other.click(testid('tab-overview'));
    await checkOverview(other, report('multi-device'));
    assert.deepEqual(other.errors, [], 'no errors (CSP included)');
  } finally {
    await fresh.close();
  }
});

/** The texts of an SVG document's `<text>` elements. */
function svgTexts(svg) {
  return [...svg.matchAll(/<text[^>]*>([^<]*)<\/text>/g)].map((m) => m[1].trim());
}

/** Labels of one axis: one unit, the same decimals, equal round steps. */
function checkRoundAxis(labels, units, what) {
  const re = new RegExp(`^(\\d+(?:\\.(\\d+))?) (${units.join('|')})$`);
  const parsed = labels.map((l) => { const m = re.exec(l); assert.ok(m, `${what}: "${l}" is a number and a unit`); return m; });
  assert.ok(parsed.length >= 3, `${what}: ${labels}`);
  assert.equal(new Set(parsed.map((m) => m[3])).size, 1, `${what}: one unit in ${labels}`);
  assert.equal(new Set(parsed.map((m) => (m[2] || '').length)).size, 1, `${what}: one precision in ${labels}`);
  const v = parsed.map((m) => Number(m[1]));
  const step = v[1] - v[0];
  const digits = String(step).replace('.', '').replace(/^0+/, '').replace(/0+$/, '');
  assert.ok(['1', '2', '25', '5'].includes(digits), `${what}: a round step (${step}) in ${labels}`);
  for (let i = 1; i < v.length; i++) assert.ok(Math.abs(v[i] - v[i - 1] - step) < 1e-9, `${what}: equal steps in ${labels}`);
}

test('timeline: call sites stacked (legend, hover names a band, a selected leak row is solid)', async (ctx) => {
  const page = await newPage(ctx, `${BASE}?trace=traces/nvtx-leak.msgpack#view=leaks`);
  const row = page.locator(testid('leak-row')).first();
  await row.waitFor({ timeout: LOAD_TIMEOUT });
  const stack = await row.getAttribute('data-stack');
  await row.click();
  await page.click(testid('tab-timeline'));
  const canvas = page.locator(testid('timeline-canvas'));
  await page.locator(`${testid('timeline-canvas')}[data-stacked="true"]`).waitFor({ timeout: LOAD_TIMEOUT });
  const bands = await page.locator(testid('stack-band')).evaluateAll((els) => els.map((e) => [e.dataset.stack, e.dataset.highlight]));
  assert.ok(bands.length >= 2 && bands.length <= 10, `legend: ${bands}`);
  assert.equal(bands.at(-1)[0], 'other', 'the last band is the other call sites');
  assert.deepEqual(bands.filter((b) => b[1] === 'true').map((b) => b[0]), [stack], 'the selected leak row is highlighted');
  // Hover low in the plot names a band of the legend; above the stack, none.
  const box = await canvas.boundingBox();
  await page.mouse.move(box.x + box.width * 0.9, box.y + box.height - 30);
  const band = page.locator(testid('hover-band'));
  await band.waitFor();
  assert.ok(bands.map((b) => b[0]).includes(await band.getAttribute('data-stack')), 'a band of the legend');
  assert.ok(Number(await band.getAttribute('data-value')) > 0);
  await page.mouse.move(box.x + box.width * 0.9, box.y + 12);
  await page.locator(testid('hover-tip')).waitFor();
  assert.equal(await band.count(), 0, 'no band above the stack');
  // A click on another legend entry selects it instead.
  const other = bands.find((b) => b[0] !== stack && b[0] !== 'other');
  await page.click(`${testid('stack-band')}[data-stack="${other[0]}"] button`);
  await page.locator(`${testid('stack-band')}[data-stack="${other[0]}"][data-highlight="true"]`).waitFor();
  await page.screenshot({ path: path.join(ARTIFACTS, 'timeline-stacked.png'), fullPage: true });
  assert.deepEqual(page.errors, []);
});

test('timeline: axis labels are round numbers of one unit, with one precision', async (ctx) => {
  const page = await newPage(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const canvas = page.locator(testid('timeline-canvas'));
  await page.locator(`${testid('timeline-canvas')}[data-drawn-at]`).waitFor({ timeout: LOAD_TIMEOUT });
  for (const zoom of [false, true]) {
    if (zoom) {
      const r0 = await visibleRange(page);
      await page.click(testid('zoom-in'));
      await page.click(testid('zoom-in'));
      await waitForRangeChange(page, r0);
    }
    const [svgDownload] = await Promise.all([page.waitForEvent('download'), page.click(testid('export-svg'))]);
    const texts = svgTexts(fs.readFileSync(await svgDownload.path(), 'utf8'));
    const bytes = texts.filter((t) => /^[\d.]+ (B|KiB|MiB|GiB|TiB)$/.test(t));
    const times = texts.filter((t) => /^[\d.]+ (ns|µs|ms|s|min|h)$/.test(t));
    checkRoundAxis(bytes, ['B', 'KiB', 'MiB', 'GiB', 'TiB'], 'y axis');
    checkRoundAxis(times, ['ns', 'µs', 'ms', 's', 'min', 'h'], 'x axis');
    const onCanvas = (await canvas.getAttribute('data-y-labels')).split('|');
    checkRoundAxis(onCanvas, ['B', 'KiB', 'MiB', 'GiB', 'TiB'], 'y axis on the canvas');
  }
  assert.deepEqual(page.errors, []);
});

test('timeline: double-click resets the zoom and leaves the pin as it was', async (ctx) => {
  const page = await newPage(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const canvas = page.locator(testid('timeline-canvas'));
  await canvas.waitFor({ timeout: LOAD_TIMEOUT });
  const full = await visibleRange(page);
  await page.click(testid('zoom-in'));
  const zoomed = await waitForRangeChange(page, full);
  const box = await canvas.boundingBox();
  await page.mouse.dblclick(box.x + box.width * 0.5, box.y + box.height * 0.5);
  assert.deepEqual(await waitForRangeChange(page, zoomed), full, 'the whole trace');
  await page.waitForTimeout(100);
  assert.equal(await page.locator(testid('pinned')).count(), 0, 'nothing pinned by the double-click');
  // With a pin: it stays where it was.
  await page.click(testid('zoom-in'));
  const z2 = await waitForRangeChange(page, full);
  await page.mouse.click(box.x + box.width * 0.3, box.y + box.height * 0.5);
  const pinned = page.locator(testid('pinned'));
  await pinned.waitFor();
  const ts = await pinned.getAttribute('data-ts');
  await page.waitForTimeout(600);
  await page.mouse.dblclick(box.x + box.width * 0.7, box.y + box.height * 0.5);
  assert.deepEqual(await waitForRangeChange(page, z2), full);
  await page.waitForTimeout(100);
  assert.equal(await pinned.getAttribute('data-ts'), ts, 'the pin is the one before');
  assert.deepEqual(page.errors, []);
});

test('timeline: the pinned moment has a colour of its own', async (ctx) => {
  const page = await newPage(ctx, `${BASE}?trace=traces/spikes.msgpack#view=timeline`);
  const canvas = page.locator(testid('timeline-canvas'));
  await page.locator(`${testid('timeline-canvas')}[data-drawn-at]`).waitFor({ timeout: LOAD_TIMEOUT });
  const box = await canvas.boundingBox();
  const x = Math.round(box.width * 0.37);
  await page.mouse.click(box.x + x, box.y + box.height * 0.5);
  await page.locator(testid('pinned')).waitFor();
  await page.waitForTimeout(200);
  // The colours drawn in the pin's column, and the marker colours of the chart.
  const colours = await canvas.evaluate((c, x) => {
    const dpr = c.width / c.clientWidth;
    const d = c.getContext('2d').getImageData(Math.round(x * dpr), 0, 1, c.height).data;
    const out = [];
    for (let i = 0; i < d.length; i += 4) out.push([d[i], d[i + 1], d[i + 2]]);
    return out;
  }, x);
  const near = (a, b, tol) => Math.hypot(a[0] - b[0], a[1] - b[1], a[2] - b[2]) <= tol;
  const pin = [0, 176, 255];
  assert.ok(colours.filter((c) => near(c, pin, 8)).length > box.height / 2, 'the pin line is drawn in its colour');
  for (const marker of [[219, 68, 55], [142, 36, 170], [230, 81, 0]]) {
    assert.ok(!near(pin, marker, 150), `far from the marker colour ${marker}`);
  }
  assert.deepEqual(page.errors, []);
});

test('timeline markers: grouped on the chart, every one listed a page at a time (N of M)', async (ctx) => {
  const trace = path.join(TRACES, 'spikes-200k.msgpack');
  if (!fs.existsSync(trace)) {
    execFileSync(GPUCOLLECT, ['synth', 'spikes', '--events', '200000', '--seed', '5', '-o', trace], { stdio: 'ignore' });
  }
  const page = await newPage(ctx, `${BASE}?trace=traces/spikes-200k.msgpack#view=timeline`);
  const list = page.locator(testid('marker-list'));
  await list.waitFor({ timeout: LOAD_TIMEOUT });
  const canvas = page.locator(testid('timeline-canvas'));
  const total = Number(await list.getAttribute('data-count'));
  assert.ok(total > 50, `${total} markers, more than a page`);
  await page.waitForFunction((n) => document.querySelector('[data-testid="timeline-canvas"]').dataset.markersDrawn === String(n), total);
  const groups = Number(await canvas.getAttribute('data-marker-groups'));
  assert.ok(groups > 0 && groups <= total, `${groups} groups`);
  await page.click(`${testid('marker-list')} summary`);
  for (;;) {
    const listed = Number(await list.getAttribute('data-listed'));
    assert.match(await page.locator(testid('marker-summary')).textContent(), new RegExp(`^Markers: ${listed} of ${total} listed`));
    assert.equal(await page.locator(testid('marker')).count(), listed);
    if (listed === total) break;
    await page.click(testid('markers-more'));
    await page.waitForFunction((n) => Number(document.querySelector('[data-testid="marker-list"]').dataset.listed) > n, listed);
  }
  assert.equal(await page.locator(testid('markers-more')).count(), 0, 'nothing left to show');
  // The last one is reachable: it zooms the timeline on itself.
  const last = page.locator(testid('marker')).last();
  const ts = BigInt(await last.getAttribute('data-ts'));
  await last.locator('button').click();
  await page.waitForFunction(() => document.querySelector('[data-testid="visible-range"]').dataset.t0 !== undefined);
  const [t0, t1] = await visibleRange(page);
  assert.ok(t0 <= ts && ts <= t1, 'the window holds the marker');
  assert.deepEqual(page.errors, []);
});

const { ctx, close } = await launch();
let failed = 0;
// ONLY=text runs the tests whose name contains it.
const chosen = tests.filter((x) => !process.env.ONLY || x.name.includes(process.env.ONLY));
for (const t of chosen) {
  const started = Date.now();
  try {
    await t.fn(ctx);
    console.log(`ok   ${t.name} (${Date.now() - started} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${t.name}\n     ${String(e.stack || e).split('\n').slice(0, 6).join('\n     ')}`);
    for (const p of ctx.pages()) {
      await p.screenshot({ path: path.join(ARTIFACTS, `failure-${tests.indexOf(t)}.png`), fullPage: true }).catch(() => {});
    }
  }
  for (const p of ctx.pages()) await p.close().catch(() => {});
}
await close();
console.log(`${chosen.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
