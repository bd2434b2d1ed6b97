// Page object of "Memory by stack": the moment shown, the icicle's cells, the frame filter.
import { LOAD_TIMEOUT } from '../harness.mjs';

export class StacksPage {
  constructor(viewer) { this.v = viewer; }

  waitShown() { return this.v.el('flame-total').waitFor({ timeout: LOAD_TIMEOUT }); }
  /** `[bytes live, trace time, moment]` of the graph shown. */
  async total() {
    const el = this.v.el('flame-total');
    return [Number(await el.getAttribute('data-value')), await el.getAttribute('data-ts'), await el.getAttribute('data-moment')];
  }
  /** Shows the moment `m` ("peak", "pinned", "end") and waits for it. */
  async show(m) {
    await this.v.click(`moment-${m}`);
    await this.v.page.locator(`[data-testid="flame-total"][data-moment="${m}"]`).waitFor();
  }
  /** Every cell: `{ depth, bytes, label }`. */
  cells() {
    return this.v.all('flame-cell').evaluateAll((els) => els.map((e) => ({ depth: Number(e.dataset.depth), bytes: Number(e.dataset.bytes), label: e.dataset.label })));
  }
  /** Clicks the cell of `label` at `depth` and waits for the filter to name it. */
  async pick(label, depth) {
    await this.v.page.locator(`[data-testid="flame-cell"][data-depth="${depth}"]`).filter({ has: this.v.page.locator(`xpath=self::*[@data-label=${JSON.stringify(label)}]`) }).first().click();
    await this.v.el('frame-filter').waitFor();
  }
}
