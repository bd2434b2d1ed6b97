// Page object of server mode: a trace the page does not download, shown from the answers of
// the `gpucollect serve` that stores it (the mode banner, the verdict, the timeline asked for
// at each window, the live set at a pinned moment, the report's call-site table and growth per
// scope).
import { LOAD_TIMEOUT } from '../harness.mjs';

/** `[data-testid="id"]` */
const testid = (id) => `[data-testid="${id}"]`;

export class ServedPage {
  constructor(viewer) {
    this.v = viewer;
    this.page = viewer.page;
  }

  /** Waits for the server-mode page with its first timeline drawn. */
  async waitShown() {
    await this.page.locator(`${testid('mode')}[data-mode="server"]`).waitFor({ timeout: LOAD_TIMEOUT });
    await this.page.locator(`${testid('timeline-canvas')}[data-columns]`).waitFor({ timeout: LOAD_TIMEOUT });
  }

  /** The window the chart last drew from the server's answer: `{ t0, t1, columns, stepMs }`. */
  async window() {
    const c = this.v.el('timeline-canvas');
    const n = async (a) => Number(await c.getAttribute(a));
    return { t0: await n('data-t0'), t1: await n('data-t1'), columns: await n('data-columns'), stepMs: await n('data-step-ms') };
  }

  /** Waits until the chart shows a window other than `before`, and returns it. */
  async waitWindowChange(before) {
    await this.page.waitForFunction((t0) => {
      const c = document.querySelector('[data-testid="timeline-canvas"]');
      return c && c.dataset.t0 && Number(c.dataset.t0) !== t0;
    }, before.t0, { timeout: LOAD_TIMEOUT });
    return this.window();
  }

  /** The verdict's findings as `{ kind, severity, headline }`. */
  async verdict() {
    return this.page.$$eval(testid('verdict-item'), (items) => items.map((li) => ({
      kind: li.dataset.kind,
      severity: li.dataset.severity,
      headline: li.querySelector('[data-testid="verdict-headline"]').textContent.trim(),
    })));
  }

  /** The rows of a call-site table of the report (`served-peak-sites`, `served-end-sites`):
   * `{ site, bytes }` each. */
  async sites(id) {
    return this.page.$$eval(`${testid(id)} [data-testid="served-site-row"]`, (rows) => rows.map((r) => ({
      site: r.querySelector('td').textContent.trim(),
      bytes: Number(r.dataset.bytes),
    })));
  }

  /** The report's call-site table: `{ site, allocated, peak }` per row. */
  async callSites() {
    return this.page.$$eval(`${testid('served-callsites')} [data-testid="served-callsite-row"]`, (rows) => rows.map((r) => ({
      site: r.querySelector('td').textContent.trim(),
      allocated: Number(r.dataset.allocated),
      peak: Number(r.dataset.peak),
    })));
  }

  /** The report's growth per scope: `{ scope, total, verdict }` per row. */
  async scopes() {
    return this.page.$$eval(`${testid('served-scopes')} [data-testid="served-scope-row"]`, (rows) => rows.map((r) => ({
      scope: r.querySelector('td').textContent.trim(),
      total: Number(r.dataset.total),
      verdict: r.querySelectorAll('td')[5].textContent.trim(),
    })));
  }

  /** Chooses a moment of the memory by stack (`peak`, `pinned`, `end`) and waits for its icicle:
   * `{ t, total, cells: [{ depth, label, bytes }] }`. */
  async stacksAt(moment) {
    await this.v.click(`served-moment-${moment}`);
    const total = this.page.locator(`${testid('served-flame-total')}[data-moment="${moment}"]`);
    await total.waitFor({ timeout: LOAD_TIMEOUT });
    return {
      t: Number(await total.getAttribute('data-ts')),
      total: Number(await total.getAttribute('data-value')),
      cells: await this.page.$$eval(`${testid('served-stacks')} [data-testid="flame-cell"]`, (cells) => cells.map((c) => ({
        depth: Number(c.dataset.depth),
        label: c.dataset.label,
        bytes: Number(c.dataset.bytes),
      }))),
    };
  }

  /** Clicks the chart at `fraction` of its plot's width and waits for the live set listed. */
  async pinAt(fraction) {
    const box = await this.v.el('timeline-canvas').boundingBox();
    // The plot spans from the y axis's labels (72 px and a margin) to 16 px from the right.
    const left = 80;
    const x = left + (box.width - left - 16) * fraction;
    await this.page.mouse.click(box.x + x, box.y + box.height / 2);
    await this.v.el('served-live').waitFor({ timeout: LOAD_TIMEOUT });
    const live = this.v.el('served-live');
    return {
      t: Number(await live.getAttribute('data-t')),
      bytes: Number(await live.getAttribute('data-bytes')),
      rows: await this.page.$$eval(testid('served-live-row'), (rows) => rows.map((r) => Number(r.dataset.bytes))),
    };
  }
}
