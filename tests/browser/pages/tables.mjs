// Page objects of the table views (call sites, leaks, spikes) and of the error panel.
import { LOAD_TIMEOUT } from '../harness.mjs';

const rowsData = (locator) => locator.evaluateAll((els) => els.map((e) => ({ ...e.dataset, text: e.textContent })));
const csvLines = (text) => text.trim().split('\r\n');

export class SitesPage {
  constructor(viewer) { this.v = viewer; }
  waitShown() { return this.v.el('sites-table').waitFor({ timeout: LOAD_TIMEOUT }); }
  /** How many call sites there are in all ("N of M shown": M). */
  async total() { return Number(await this.v.value('sites-count')); }
  sortBy(key) { return this.v.click(`sort-${key}`); }
  rows() { return this.v.all('site-row'); }
  /** Types into the frame search (in the filter bar: it filters every view). */
  async search(text) { await this.v.page.fill('[data-testid="site-search"]', text); }
  searchText() { return this.v.page.inputValue('[data-testid="site-search"]'); }
  /** Every row: `{ stack, label, text, shared }` (`shared`: the "N stacks share this label" count, or 0). */
  rowsData() {
    return this.rows().evaluateAll((els) => els.map((e) => {
      const mark = e.querySelector('[data-testid="shared-label"]');
      return { stack: e.dataset.stack, label: e.querySelector('summary').textContent, text: e.textContent, shared: mark ? Number(mark.dataset.count) : 0 };
    }));
  }
  /** Expands the row's "stacks share this label" mark; the stacks it lists (`data-stack`). */
  async sharedStacks(stack) {
    const mark = this.v.page.locator(`[data-testid="site-row"][data-stack="${stack}"] [data-testid="shared-label"]`);
    await mark.locator('summary').click();
    const items = mark.locator('[data-testid="shared-stack"]');
    await items.first().waitFor({ state: 'visible' });
    return items.evaluateAll((els) => els.map((e) => ({ stack: e.dataset.stack, text: e.textContent })));
  }
  /** Waits until fewer than `n` call sites are counted. */
  waitForFewerThan(n) {
    return this.v.page.waitForFunction((k) => Number(document.querySelector('[data-testid="sites-count"]').dataset.value) < k, n);
  }
  async exportCsv() { return csvLines(await this.v.downloadText('export-csv')); }
}

export class LeaksPage {
  constructor(viewer) { this.v = viewer; }
  waitShown() { return this.v.el('leaks-table').waitFor({ timeout: LOAD_TIMEOUT }); }
  /** The live-at-end rows' bytes, summed (from their raw values). */
  sumLive() { return this.v.all('leak-live').evaluateAll((els) => els.reduce((s, e) => s + Number(e.dataset.value), 0)); }
  leakRows() { return this.v.all('leak-row'); }
  /** Expands the first live-at-end row and waits for its detail. */
  async expandFirst() {
    await this.leakRows().first().click();
    await this.v.el('leak-detail').waitFor();
    return this.v.el('leak-detail');
  }

  waitScopes() { return this.v.el('scopes-table').waitFor({ timeout: LOAD_TIMEOUT }); }
  /** The scope rows' data (`scope`, `total`, `avg`, `calls`, `growth`, `severity`, ...) and text. */
  scopeRows() { return rowsData(this.v.all('scope-row')); }
  scopeRow(scope) { return this.v.page.locator(`[data-testid="scope-row"][data-scope="${scope}"]`); }
  /** The text of a scope row's cell (`total` growth or growth `per-call`). */
  async scopeCell(scope, cell) {
    const i = { total: 3, 'per-call': 4 }[cell];
    return (await this.scopeRow(scope).locator('td').nth(i).textContent()).trim();
  }
  sortScopesBy(key) { return this.v.click(`scope-sort-${key}`); }
  waitScopeSort(key, order) {
    return this.v.page.waitForFunction(([k, o]) => document.querySelector(`[data-testid="scope-sort-${k}"]`).closest('th').getAttribute('aria-sort') === o, [key, order]);
  }
  async exportScopesCsv() { return csvLines(await this.v.downloadText('export-csv', 'scopes-section')); }
  /** Expands a scope row and returns its detail. */
  async expandScope(scope) {
    await this.scopeRow(scope).click();
    const detail = this.v.el('scope-detail');
    await detail.waitFor();
    return detail;
  }
}

export class SpikesPage {
  constructor(viewer) { this.v = viewer; }
  waitShown() { return this.v.el('detected-spikes-table').waitFor({ timeout: LOAD_TIMEOUT }); }
  /** The detected spikes' rows: `{ ts, size, live, timeline, text }`. */
  detected() { return rowsData(this.v.all('detected-spike-row')); }
  /** The size of the detected spike at `ts`, as the table shows it. */
  async sizeTextAt(ts) {
    const row = this.v.page.locator(`[data-testid="detected-spike-row"][data-ts="${ts}"]`).first();
    return (await row.locator('td').nth(1).textContent()).trim();
  }
  openFirst() { return this.v.all('detected-spike-row').first().click(); }
  /** The texts of the first column ("At") of the table `testid`. */
  atColumn(testid) {
    return this.v.page.locator(`[data-testid="${testid}"] tbody tr td:first-child`).evaluateAll((tds) => tds.map((td) => td.textContent.trim()));
  }
}

export class ErrorPanel {
  constructor(viewer) { this.v = viewer; }
  get panel() { return this.v.el('error-panel'); }
  waitShown() { return this.panel.waitFor({ timeout: LOAD_TIMEOUT }); }
  async shown() { return (await this.v.count('error-panel')) > 0; }
  message() { return this.v.text('error-message'); }
  /** Waits until the message matches `re`. */
  waitForMessage(re) {
    return this.v.page.waitForFunction((src) => new RegExp(src).test(document.querySelector('[data-testid="error-message"]')?.textContent || ''), re.source, { timeout: LOAD_TIMEOUT });
  }
  async text() { return this.panel.textContent(); }
  /** The "viewer stopped" box. */
  get fatal() { return this.v.el('fatal-error'); }
}
