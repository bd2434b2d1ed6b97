// Server mode benchmark (not a test): a `gpucollect serve` at SERVE_URL holding trace ID
// (its summary already made), the viewer opened on it in server mode. Prints one JSON line:
// the time from navigation to the first chart drawn from the server's answer, and each zoom
// step's time from the click to the new window drawn (request, answer, parse and draw).
// Env: SERVE_URL, ID, STEPS (default 12). Run by scripts/bench-served.sh.
import { launch } from '../lib.mjs';

const { SERVE_URL, ID } = process.env;
const STEPS = Number(process.env.STEPS || 12);
const { ctx, close } = await launch();
const page = await ctx.newPage();
const trace = `/api/v1/traces/${ID}`;
const t0 = Date.now();
await page.goto(new URL(`?trace=${encodeURIComponent(trace)}&mode=server`, SERVE_URL).href);
await page.locator('[data-testid="timeline-canvas"][data-columns]').waitFor({ timeout: 600_000 });
const firstChartMs = await page.evaluate(() => {
  const m = performance.getEntriesByName('gpucollect:served-window')[0];
  return m ? m.startTime : null;
});
const wallFirstMs = Date.now() - t0;
const steps = [];
for (let i = 0; i < STEPS; i++) {
  const before = await page.locator('[data-testid="timeline-canvas"]').getAttribute('data-t0');
  const before1 = await page.locator('[data-testid="timeline-canvas"]').getAttribute('data-t1');
  const started = Date.now();
  // Zoom in, then every fourth step pan, so each step is a window not asked before.
  await page.click(i % 4 === 3 ? '[data-testid="pan-right"]' : '[data-testid="zoom-in"]');
  await page.waitForFunction(([a, b]) => {
    const c = document.querySelector('[data-testid="timeline-canvas"]');
    return c.dataset.t0 !== a || c.dataset.t1 !== b;
  }, [before, before1], { timeout: 60_000 });
  const stepMs = Number(await page.locator('[data-testid="timeline-canvas"]').getAttribute('data-step-ms'));
  steps.push({ click_to_drawn_ms: Date.now() - started, request_to_drawn_ms: stepMs });
}
const sorted = (k) => steps.map((s) => s[k]).sort((a, b) => a - b);
const median = (a) => a[Math.floor(a.length / 2)];
console.log(JSON.stringify({
  first_chart_ms: firstChartMs && Math.round(firstChartMs),
  wall_first_chart_ms: wallFirstMs,
  zoom_steps: steps.length,
  zoom_click_to_drawn_ms: { median: median(sorted('click_to_drawn_ms')), max: Math.max(...sorted('click_to_drawn_ms')) },
  zoom_request_to_drawn_ms: { median: median(sorted('request_to_drawn_ms')), max: Math.max(...sorted('request_to_drawn_ms')) },
}));
await close();
