// Server mode: a trace of a `gpucollect serve` larger than the page opens itself is not
// downloaded; the page shows the server's summaries (API.md, "Summaries"), and says so.
import assert from 'node:assert/strict';
import { LOAD_TIMEOUT, SERVE_URL, report, spec, traceBytes } from '../harness.mjs';
import { Viewer } from '../pages/viewer.mjs';

const { tests, test } = spec();
export default tests;

async function upload(name) {
  assert.ok(SERVE_URL, 'SERVE_URL is set by scripts/test-browser.sh');
  const bytes = traceBytes(`${name}.msgpack`);
  const up = await fetch(new URL('api/v1/traces', SERVE_URL), { method: 'POST', body: bytes });
  assert.equal(up.status, 201, await up.clone().text());
  const { id } = await up.json();
  return { id, size: bytes.length, trace: `/api/v1/traces/${id}` };
}

/** The viewer of SERVE_URL opening `trace` with the query `extra`, recording every request. */
async function openServed(ctx, trace, extra) {
  const v = await Viewer.open(ctx);
  const requests = [];
  v.page.on('request', (r) => requests.push(`${r.method()} ${new URL(r.url()).pathname}`));
  await v.goto(new URL(`?trace=${encodeURIComponent(trace)}${extra}`, SERVE_URL).href);
  return { v, requests };
}

test('a trace larger than the page takes opens through the server: verdict, call-site tables, timeline per window, live set at a pin, memory by stack, and nothing downloaded', async (ctx) => {
  const { size, trace } = await upload('training-leak');
  const want = report('training-leak');
  // The page's limit set below this trace's size: the decision a 4 GiB trace gets by default.
  const { v, requests } = await openServed(ctx, trace, `&max_download=${size - 1}`);
  await v.served.waitShown();
  const banner = await v.text('mode');
  assert.match(banner, /Server mode/, banner);
  assert.match(banner, /larger than a page opens itself/, banner);
  // The verdict is the report's, in its order.
  const verdict = await v.served.verdict();
  assert.deepEqual(verdict.map((f) => f.headline), want.findings.map((f) => f.headline));
  assert.ok(verdict.length > 0 && verdict[0].kind === want.findings[0].kind, JSON.stringify(verdict[0]));
  assert.equal(Number(await v.el('served-facts').getAttribute('data-peak')), want.peak_bytes);
  // What was live at the peak and at the end, by call site: the report's tables.
  const pick = (rows) => rows.map((r) => ({ site: r.site, bytes: r.bytes }));
  assert.deepEqual(await v.served.sites('served-peak-sites'), pick(want.peak_sites));
  assert.deepEqual(await v.served.sites('served-end-sites'), pick(want.live_at_end_sites));
  assert.ok(want.peak_sites.length > 0);
  // The report's call-site table and its growth per scope, row for row.
  assert.deepEqual(await v.served.callSites(), want.analysis.sites.map((r) => ({ site: r.site, allocated: r.alloc_bytes, peak: r.peak_bytes })));
  const scopes = await v.served.scopes();
  assert.deepEqual(scopes.map((r) => ({ scope: r.scope, total: r.total })), want.analysis.scopes.map((r) => ({ scope: r.scope, total: r.total_growth_bytes })));
  assert.ok(scopes.length > 0 && scopes.some((r) => r.verdict.startsWith('flagged')), JSON.stringify(scopes));
  // The first window is the whole trace at the chart's resolution.
  const first = await v.served.window();
  assert.equal(first.t0, want.first_ts_nanos);
  assert.equal(first.t1, want.last_ts_nanos + 1);
  assert.ok(first.columns >= 300, `a column per pixel: ${first.columns}`);
  // Each zoom step asks the server for the new window.
  await v.click('zoom-in');
  const zoomed = await v.served.waitWindowChange(first);
  const span = (w) => w.t1 - w.t0;
  assert.ok(Math.abs(span(zoomed) - span(first) / 2) <= 2, `half the window: ${JSON.stringify(zoomed)}`);
  await v.page.keyboard.press('ArrowRight');
  const panned = await v.served.waitWindowChange(zoomed);
  assert.ok(panned.t0 > zoomed.t0, `panned right: ${JSON.stringify(panned)}`);
  await v.click('zoom-reset');
  const whole = await v.served.waitWindowChange(panned);
  assert.deepEqual([whole.t0, whole.t1], [first.t0, first.t1]);
  const timelineAsks = requests.filter((r) => r.endsWith(`${trace}/timeline`)).length;
  assert.ok(timelineAsks >= 4, `a timeline request per window: ${requests.join(', ')}`);
  // Pinning a moment lists what was live then, as the server says.
  const live = await v.served.pinAt(0.9);
  const direct = await (await fetch(new URL(`${trace}/live?t=${live.t}&limit=50`, SERVE_URL))).json();
  assert.equal(live.bytes, direct.bytes);
  assert.deepEqual(live.rows, direct.sites.map((s) => s.bytes));
  assert.ok(live.bytes > 0, 'memory is live late in a leaking run');
  // Memory by stack at the peak, the pinned moment and the end: the server's live set then,
  // merged by stack, outermost frames at the top.
  for (const [moment, t] of [['peak', want.peak_ts_nanos], ['pinned', live.t], ['end', want.last_ts_nanos]]) {
    const st = await v.served.stacksAt(moment);
    assert.equal(st.t, t, moment);
    const at = await (await fetch(new URL(`${trace}/live?t=${t}&limit=10000`, SERVE_URL))).json();
    assert.equal(st.total, at.bytes, moment);
    const top = st.cells.filter((c) => c.depth === 0).reduce((n, c) => n + c.bytes, 0);
    assert.equal(top, at.bytes, `${moment}: the outermost cells hold everything live`);
    const outermost = at.sites[0].frames[at.sites[0].frames.length - 1];
    assert.ok(st.cells.some((c) => c.depth === 0 && c.label === outermost), `${moment}: ${outermost}`);
  }
  assert.equal((await v.served.stacksAt('peak')).total, want.peak_bytes);
  // The trace itself was never downloaded: its size was asked (HEAD), its bytes never (GET).
  assert.ok(requests.includes(`HEAD ${trace}`), requests.join(', '));
  assert.ok(!requests.includes(`GET ${trace}`), `no download: ${requests.join(', ')}`);
  await v.screenshot('server-mode.png');
  assert.deepEqual(v.errors, []);
});

test('while the first window is slow to come (a server reading a large trace), the page says why, and the note goes once it is drawn', async (ctx) => {
  const { trace } = await upload('training-leak');
  const v = await Viewer.open(ctx);
  // The server's first timeline answer held back, as a restarted server's is while it decodes
  // the trace (its summary already kept in the store).
  let release;
  const held = new Promise((r) => { release = r; });
  await v.page.route((url) => url.pathname.endsWith('/timeline'), async (route) => {
    await held;
    await route.continue();
  });
  await v.goto(new URL(`?trace=${encodeURIComponent(trace)}&mode=server`, SERVE_URL).href);
  await v.page.locator('[data-testid="mode"][data-mode="server"]').waitFor({ timeout: LOAD_TIMEOUT });
  await v.el('served-waiting').waitFor({ timeout: LOAD_TIMEOUT });
  const note = await v.text('served-waiting');
  assert.match(note, /reading the trace to draw its timeline/, note);
  assert.ok((await v.served.verdict()).length > 0, 'the verdict is shown while the timeline waits');
  release();
  await v.served.waitShown();
  await v.el('served-waiting').waitFor({ state: 'detached', timeout: LOAD_TIMEOUT });
  assert.equal(await v.count('served-waiting'), 0);
  assert.deepEqual(v.errors, []);
});

test('a trace within the limit is downloaded and analysed in the page, which says so; mode=server forces the server', async (ctx) => {
  const { trace } = await upload('spikes');
  const { v, requests } = await openServed(ctx, trace, '');
  await v.page.locator('[data-testid="mode"][data-mode="local"]').waitFor({ timeout: LOAD_TIMEOUT });
  assert.ok(requests.includes(`GET ${trace}`), requests.join(', '));
  await v.close();
  const forced = await openServed(ctx, trace, '&mode=server');
  await forced.v.served.waitShown();
  assert.match(await forced.v.text('mode'), /as the address asks \(mode=server\)/);
  assert.ok(!forced.requests.includes(`GET ${trace}`), forced.requests.join(', '));
  assert.deepEqual(forced.v.errors, []);
});

test('server mode in words when it cannot work: an unknown trace, a URL that is not a server trace, a bad mode', async (ctx) => {
  const missing = await openServed(ctx, '/api/v1/traces/0123456789abcdef0123456789abcdef', '&mode=server');
  await missing.v.el('error-panel').waitFor({ timeout: LOAD_TIMEOUT });
  assert.match(await missing.v.text('error-message'), /the server answered 404: no trace 0123456789abcdef0123456789abcdef/);
  const other = await openServed(ctx, '/api/v1/demos/spikes', '&mode=server');
  await other.v.el('error-panel').waitFor({ timeout: LOAD_TIMEOUT });
  assert.match(await other.v.text('error-message'), /is not a trace of a gpucollect server/);
  const bad = await openServed(ctx, '/api/v1/demos/spikes', '&mode=remote');
  await bad.v.el('error-panel').waitFor({ timeout: LOAD_TIMEOUT });
  assert.match(await bad.v.text('error-message'), /use mode=server/);
  const size = await openServed(ctx, '/api/v1/demos/spikes', '&max_download=lots');
  await size.v.el('error-panel').waitFor({ timeout: LOAD_TIMEOUT });
  assert.match(await size.v.text('error-message'), /max_download=lots, which is not a size/);
});
