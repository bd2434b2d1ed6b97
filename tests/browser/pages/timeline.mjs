// Page object of the timeline: the canvas, its visible window, zoom and pan controls, the
// hover tip, the pinned moment, markers and the chart's exports.
import { LOAD_TIMEOUT } from '../harness.mjs';

export class TimelinePage {
  constructor(viewer) { this.v = viewer; }

  get canvas() { return this.v.el('timeline-canvas'); }
  /** Waits for the canvas (`drawn`: until it has been drawn once). */
  async waitShown({ drawn = false } = {}) {
    const sel = drawn ? 'canvas[data-testid="timeline-canvas"][data-drawn-at]' : '[data-testid="timeline-canvas"]';
    await this.v.page.locator(sel).waitFor({ timeout: LOAD_TIMEOUT });
  }
  box() { return this.canvas.boundingBox(); }
  /** The canvas' backing store and CSS sizes: `[width, height, cssWidth, cssHeight]`. */
  sizes() { return this.canvas.evaluate((c) => [c.width, c.height, c.clientWidth, c.clientHeight]); }

  /** The visible window `[t0, t1]` in trace nanoseconds (BigInt). */
  async range() {
    const el = this.v.el('visible-range');
    return [BigInt(await el.getAttribute('data-t0')), BigInt(await el.getAttribute('data-t1'))];
  }
  /** Waits until the visible window differs from `before`, and returns it. */
  async waitForRangeChange(before) {
    await this.v.page.waitForFunction(([t0, t1]) => {
      const el = document.querySelector('[data-testid="visible-range"]');
      return el && (el.dataset.t0 !== t0 || el.dataset.t1 !== t1);
    }, [String(before[0]), String(before[1])]);
    return this.range();
  }

  zoomIn() { return this.v.click('zoom-in'); }
  panRight() { return this.v.click('pan-right'); }

  /** A point of the canvas at fractions `fx`, `fy` of its size, in page coordinates. */
  async at(fx, fy) {
    const b = await this.box();
    return [b.x + b.width * fx, b.y + b.height * fy];
  }
  /** Clicks at fractions of the canvas and waits for the pinned moment. */
  async pinAt(fx, fy) {
    const [x, y] = await this.at(fx, fy);
    await this.v.page.mouse.click(x, y);
    await this.v.el('pinned').waitFor();
    return this.pinned();
  }
  /** The pinned moment's trace time (a string of nanoseconds), or null. */
  async pinned() {
    return (await this.v.count('pinned')) ? this.v.el('pinned').getAttribute('data-ts') : null;
  }
  /** Drags across the canvas from fraction `from` to `to` of its width, at height `fy`. */
  async brush(from, to, fy) {
    const [x0, y] = await this.at(from, fy);
    const [x1] = await this.at(to, fy);
    const mouse = this.v.page.mouse;
    await mouse.move(x0, y);
    await mouse.down();
    await mouse.move((x0 + x1) / 2, y, { steps: 5 });
    await mouse.move(x1, y, { steps: 5 });
    await mouse.up();
  }
  /** The hover tip's element. */
  get hoverTip() { return this.v.el('hover-tip'); }
  /** The timestamps of the listed markers of `kind` (e.g. "spike"). */
  markerTimes(kind) {
    return this.v.page.locator(`[data-testid="marker-list"] [data-testid="marker"][data-kind="${kind}"]`)
      .evaluateAll((els) => els.map((e) => e.dataset.ts));
  }
  markers(kind) {
    return this.v.page.locator(`[data-testid="marker-list"] [data-testid="marker"][data-kind="${kind}"]`);
  }
  /** The chart exported as SVG (its text). */
  exportSvg() { return this.v.downloadText('export-svg'); }
  /** The chart exported as PNG (the downloaded file's path). */
  exportPng() { return this.v.download('export-png'); }
}
