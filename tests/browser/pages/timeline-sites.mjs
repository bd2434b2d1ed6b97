// Page object of the timeline's stacked call sites and what the chart says about itself: the
// sites' legend, the band the hover tip names, the axis labels (on the canvas and in the SVG
// export), the pixels of one column, and the marker list's pages.
import { LOAD_TIMEOUT } from '../harness.mjs';
import { testid } from './viewer.mjs';

export class TimelineSites {
  constructor(viewer) { this.v = viewer; this.tl = viewer.timeline; }

  /** Waits until the chart has been drawn with the call sites stacked. */
  waitStacked() {
    return this.v.page.locator('canvas[data-testid="timeline-canvas"][data-stacked="true"]').waitFor({ timeout: LOAD_TIMEOUT });
  }
  /** The legend's entries: `[stack, highlighted]` each, bottom band first ("other" last). */
  legend() {
    return this.v.all('stack-band').evaluateAll((els) => els.map((e) => [e.dataset.stack, e.dataset.highlight === 'true']));
  }
  /** Clicks the legend entry of `stack` and waits until it is the highlighted one. */
  async select(stack) {
    await this.v.page.click(`${testid('stack-band')}[data-stack="${stack}"] button`);
    await this.v.page.locator(`${testid('stack-band')}[data-stack="${stack}"][data-highlight="true"]`).waitFor();
  }
  /** The band the hover tip names. */
  get hoverBand() { return this.v.el('hover-band'); }

  /** The texts of the SVG export's `<text>` elements. */
  async svgTexts() {
    const svg = await this.tl.exportSvg();
    return [...svg.matchAll(/<text[^>]*>([^<]*)<\/text>/g)].map((m) => m[1].trim());
  }
  /** The y axis's labels as drawn on the canvas, bottom first. */
  async canvasYLabels() { return (await this.tl.canvas.getAttribute('data-y-labels')).split('|'); }

  /** The colours `[r, g, b]` of the canvas' pixel column at CSS x `x`, top to bottom. */
  column(x) {
    return this.tl.canvas.evaluate((c, x) => {
      const dpr = c.width / c.clientWidth;
      const d = c.getContext('2d').getImageData(Math.round(x * dpr), 0, 1, c.height).data;
      const out = [];
      for (let i = 0; i < d.length; i += 4) out.push([d[i], d[i + 1], d[i + 2]]);
      return out;
    }, x);
  }

  /** Markers the chart drew (the sum of its groups' counts) and the groups it drew. */
  async drawnMarkers() {
    const c = this.tl.canvas;
    return [Number(await c.getAttribute('data-markers-drawn')), Number(await c.getAttribute('data-marker-groups'))];
  }
  get markerList() { return this.v.el('marker-list'); }
  /** `[listed, total]` of the marker list. */
  async markerCounts() {
    const l = this.markerList;
    return [Number(await l.getAttribute('data-listed')), Number(await l.getAttribute('data-count'))];
  }
  summary() { return this.v.text('marker-summary'); }
  /** Opens the list (a `<details>`). */
  open() { return this.v.page.click(`${testid('marker-list')} summary`); }
  /** "Show more", and waits for the longer list. */
  async more() {
    const [listed] = await this.markerCounts();
    await this.v.click('markers-more');
    await this.v.page.waitForFunction((n) => Number(document.querySelector('[data-testid="marker-list"]').dataset.listed) > n, listed);
  }
}
