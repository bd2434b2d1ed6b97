// Errors in words: files that are not traces, newer formats, cut traces, missing URLs, another
// site's URL, and the WebAssembly stopping.
import assert from 'node:assert/strict';
import zlib from 'node:zlib';
import { BASE, LOAD_TIMEOUT, SERVE_URL, report, spec, startServe, traceBytes } from '../harness.mjs';
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

test('files that are not traces are named for what they are: JSON that is not a snapshot, a PNG image, a gzip file', async (ctx) => {
  const v = await Viewer.open(ctx, BASE);
  await v.waitForWelcome();
  const cases = [
    // JSON, but not a PyTorch snapshot: an error, never an empty trace graded 100 (A).
    ['package.json', Buffer.from(JSON.stringify({ name: 'app', version: '1.0.0', dependencies: { a: '1' } }, null, 2)),
      /not a PyTorch memory snapshot.*segments.*device_traces/],
    ['chart.png', Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Buffer.alloc(200, 7)]),
      /PNG image/],
    ['run.msgpack.gz', zlib.gzipSync(traceBytes('spikes.msgpack')),
      /gzip.*gunzip/],
  ];
  for (const [name, bytes, said] of cases) {
    await v.drop(name, bytes);
    await v.errorPanel.waitForMessage(said);
    assert.equal(await v.count('ov-score'), 0, `${name}: no overview (no score) for a file that is not a trace`);
    assert.ok(!(await v.errorPanel.message()).includes('JsValue'), `${name}: in words`);
  }
  await v.screenshot('error-gzip.png', {});
});

test('when the WebAssembly stops while the detectors run, "Detecting…" does not stay on screen', async (ctx) => {
  const v = await Viewer.open(ctx);
  // The moment the overview says "Detecting…", the WebAssembly stops (what an allocation that
  // finds its memory full does): the page's state right then is what stays on screen.
  await v.page.addInitScript(() => {
    new MutationObserver((records, observer) => {
      const detecting = document.querySelector('[data-testid="detecting"]');
      if (!detecting) return;
      observer.disconnect();
      reportError(new WebAssembly.RuntimeError('unreachable'));
      window.__afterStop = {
        fatal: !!document.querySelector('[data-testid="fatal-error"]'),
        text: detecting.textContent,
        busy: detecting.getAttribute('aria-busy'),
      };
    }).observe(document, { subtree: true, childList: true });
  });
  await v.goto(`${BASE}?trace=traces/spikes.msgpack`);
  await v.page.waitForFunction(() => window.__afterStop, null, { timeout: LOAD_TIMEOUT });
  const s = await v.page.evaluate(() => window.__afterStop);
  assert.ok(s.fatal, 'the page says the viewer stopped');
  assert.doesNotMatch(s.text, /Detecting/, `no "Detecting…" left: ${s.text}`);
  assert.match(s.text, /stopped/);
  assert.notEqual(s.busy, 'true', 'not busy any more');
});

test('a ?trace= URL on another site: refused in words by default, opened where gpucollect serve allows its origin', async (ctx) => {
  assert.ok(SERVE_URL, 'SERVE_URL is set by scripts/test-browser.sh');
  // The traces' server allows reads from any origin (CORS): what stops the download is the
  // page's own Content-Security-Policy.
  const other = new URL(BASE).origin;
  const trace = new URL('traces/spikes.msgpack', BASE).href;
  const escaped = other.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
  const v = await Viewer.open(ctx, new URL(`?trace=${encodeURIComponent(trace)}`, SERVE_URL).href);
  await v.errorPanel.waitForMessage(new RegExp(`another site, ${escaped}.*gpucollect serve --allow-trace-origin ${escaped}`));
  const said = await v.errorPanel.message();
  assert.ok(!said.includes('JsValue') && !said.includes('    at '), `in words: ${said}`);
  assert.ok(said.endsWith(trace), `the URL last: ${said}`);
  await v.screenshot('error-cross-origin-trace.png', {});

  const serve = await startServe(['--allow-trace-origin', other]);
  try {
    const ok = await Viewer.open(ctx, new URL(`?trace=${encodeURIComponent(trace)}`, serve.url).href);
    await ok.overview.expectReport(report('spikes'));
    assert.deepEqual(ok.errors, [], 'no CSP violation');
  } finally {
    serve.stop();
  }
});
