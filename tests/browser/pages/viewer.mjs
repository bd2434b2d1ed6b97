// Page object of the viewer's shell: opening traces (drop, file dialog, URL), the tabs, the
// header's links, and the errors the page reported. The views' own page objects hang off it:
// `viewer.overview`, `viewer.timeline`, `viewer.sites`, `viewer.leaks`, `viewer.spikes`,
// `viewer.errorPanel`, `viewer.served` (server mode).
import fs from 'node:fs';
import { LOAD_TIMEOUT, artifact } from '../harness.mjs';
import { dropFile } from '../lib.mjs';
import { OverviewPage } from './overview.mjs';
import { ServedPage } from './served.mjs';
import { TimelinePage } from './timeline.mjs';
import { SitesPage, LeaksPage, SpikesPage, ErrorPanel } from './tables.mjs';

/** `[data-testid="id"]` */
export const testid = (id) => `[data-testid="${id}"]`;

export class Viewer {
  /** A new tab in `ctx`, recording page errors; goes to `url` if given (else call `goto` after
   * setting up routes or init scripts on `viewer.page`). */
  static async open(ctx, url) {
    const viewer = new Viewer(await ctx.newPage());
    if (url) await viewer.goto(url);
    return viewer;
  }

  constructor(page) {
    this.page = page;
    /** Uncaught exceptions. */
    this.pageErrors = [];
    /** Uncaught exceptions and console errors. */
    this.errors = [];
    page.on('pageerror', (e) => { this.pageErrors.push(String(e)); this.errors.push(String(e)); });
    page.on('console', (m) => { if (m.type() === 'error') this.errors.push(m.text()); });
    this.overview = new OverviewPage(this);
    this.timeline = new TimelinePage(this);
    this.sites = new SitesPage(this);
    this.leaks = new LeaksPage(this);
    this.spikes = new SpikesPage(this);
    this.errorPanel = new ErrorPanel(this);
    this.served = new ServedPage(this);
  }

  goto(url) { return this.page.goto(url); }
  close() { return this.page.close(); }
  /** The first element of that test id. */
  el(id) { return this.page.locator(testid(id)).first(); }
  /** Every element of that test id. */
  all(id) { return this.page.locator(testid(id)); }
  count(id) { return this.page.locator(testid(id)).count(); }
  value(id) { return this.el(id).getAttribute('data-value'); }
  async text(id) { return (await this.el(id).textContent()).trim(); }
  click(id) { return this.page.click(testid(id)); }
  screenshot(name, options = { fullPage: true }) { return this.page.screenshot({ path: artifact(name), ...options }); }

  /** The welcome screen (nothing opened yet). */
  waitForWelcome(options = { timeout: LOAD_TIMEOUT }) { return this.el('welcome').waitFor(options); }
  /** Drops a file on the page, as a user dragging it in. */
  drop(name, bytes) { return dropFile(this.page, name, bytes); }
  /** Picks `file` (a path) in the "Open trace…" dialog. */
  pick(file) { return this.page.setInputFiles(testid('file-picker'), file); }
  /** The name of what is open, as the header shows it. */
  source() { return this.text('source'); }
  /** Waits until the header names `name` as what is open. */
  waitForSource(name) {
    return this.el('source').filter({ hasText: name }).waitFor({ timeout: LOAD_TIMEOUT });
  }
  /** The view shown (`main[data-view]`). */
  view() { return this.page.locator('main').getAttribute('data-view'); }
  /** Clicks a view's tab and waits for it. */
  async openTab(view) {
    await this.click(`tab-${view}`);
    await this.page.locator(`main[data-view="${view}"]`).waitFor();
  }
  /** Clicks `id` and returns the path of the file it downloads. */
  async download(id, within) {
    const target = within ? `${testid(within)} ${testid(id)}` : testid(id);
    const [d] = await Promise.all([this.page.waitForEvent('download'), this.page.click(target)]);
    return d.path();
  }
  /** Clicks `id` and returns the text of the file it downloads. */
  async downloadText(id, within) { return fs.readFileSync(await this.download(id, within), 'utf8'); }

  /** Who read each slice of the last files opened: "worker" or "page" (performance marks). */
  sliceReaders() {
    return this.page.evaluate(() => performance.getEntriesByType('mark').map((m) => m.name)
      .filter((n) => n.startsWith('gpucollect:slice-read-by-'))
      .map((n) => n.slice('gpucollect:slice-read-by-'.length)));
  }
  /** Waits until the worker that reads files has said it runs (a performance mark): a file
   * chosen from then on is streamed by it. */
  waitForReadWorker() {
    return this.page.waitForFunction(() => performance.getEntriesByName('gpucollect:read-worker-ready').length > 0, null, { timeout: LOAD_TIMEOUT });
  }
  /** How many times the detectors have finished (performance marks). */
  analysedCount() { return this.page.evaluate(() => performance.getEntriesByName('gpucollect:analysed').length); }

  /** The device filter's element. */
  deviceFilter() { return this.el('filter-device'); }
  selectDevice(option) { return this.page.selectOption(testid('filter-device'), option); }

  /** "Copy link": the link the header then shows. */
  async copyLink() {
    await this.click('copy-link');
    return this.el('share-link').inputValue();
  }
  /** The `data-testid` of the element with the keyboard focus ('' for none). */
  focused() { return this.page.evaluate(() => document.activeElement?.dataset?.testid || ''); }
  /** Presses Tab until `id` has the focus (at most `limit` times); whether it got it. */
  async tabTo(id, limit = 60) {
    for (let i = 0; i < limit; i++) {
      if (await this.focused() === id) return true;
      await this.page.keyboard.press('Tab');
    }
    return (await this.focused()) === id;
  }

  /** "Share", then "Upload" when it asks: waits for the upload's link and returns it. */
  async share() {
    await this.click('share');
    await this.click('share-confirm');
    await this.page.waitForFunction(() => {
      const el = document.querySelector('[data-testid="share-link"]');
      return el && /^https?:\/\/.*\/t\/[0-9a-f]{32}#/.test(el.value);
    }, null, { timeout: LOAD_TIMEOUT });
    return this.el('share-link').inputValue();
  }
}
