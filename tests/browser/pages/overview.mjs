// Page object of the overview: the summary cards, findings and per-device peaks.
import assert from 'node:assert/strict';
import { LOAD_TIMEOUT } from '../harness.mjs';
import { assertBytesText, assertDurationText, shown } from './values.mjs';

export class OverviewPage {
  constructor(viewer) { this.v = viewer; }

  /** Waits until the overview's numbers are shown. */
  waitLoaded() { return this.v.el('ov-peak').waitFor({ timeout: LOAD_TIMEOUT }); }

  /** Waits for the verdict (it comes with the detectors' report). */
  waitVerdict() { return this.v.el('verdict').waitFor({ timeout: LOAD_TIMEOUT }); }
  /** The verdict: `{ healthy, text, items: [{ kind, severity, headline, location, stack,
   * bytesPerIteration, bytesPerHour, secondsToFull }] }`, as the page shows it. */
  async verdict() {
    const el = this.v.el('verdict');
    const items = await this.v.all('verdict-item').evaluateAll((els) => els.map((e) => ({
      kind: e.dataset.kind,
      severity: e.dataset.severity,
      headline: e.querySelector('[data-testid="verdict-headline"]').textContent.trim(),
      location: e.dataset.location,
      stack: e.dataset.stack,
      bytesPerIteration: e.dataset.bytesPerIteration,
      bytesPerHour: e.dataset.bytesPerHour,
      secondsToFull: e.dataset.secondsToFull,
    })));
    return { healthy: (await el.getAttribute('data-healthy')) === 'true', text: (await el.textContent()).trim(), items };
  }
  /** Whether the whole verdict is inside the viewport as the page opens (no scrolling). */
  async verdictOnFirstScreen() {
    const box = await this.v.el('verdict').boundingBox();
    const { height } = this.v.page.viewportSize();
    return box !== null && box.y >= 0 && box.y + box.height <= height;
  }
  /** Follows the link of the verdict's `i`-th sentence to its evidence. */
  openEvidence(i) { return this.v.all('verdict-evidence').nth(i).click(); }

  /** The findings' rows, in the page's order: `{ severity, kind, value }`. */
  findings() {
    return this.v.all('finding').evaluateAll((els) => els.map((e) => ({ severity: e.dataset.severity, kind: e.dataset.kind, value: e.dataset.value })));
  }

  /** Asserts that the overview shows report `r` (`gpucollect report --format json`): each
   * number's raw value equals the report's, and its text stands for it. */
  async expectReport(r) {
    await this.waitLoaded();
    const checks = [
      ['ov-peak', r.peak_bytes, assertBytesText],
      ['ov-live-end', r.live_at_end_bytes, assertBytesText],
      ['ov-duration', r.duration_nanos, assertDurationText],
      ['ov-peak-time', r.peak_ts_nanos - r.first_ts_nanos, assertDurationText],
      ['ov-allocs', r.alloc_count],
      ['ov-records', r.records],
      ['ov-live-end-count', r.live_at_end_count],
      ['ov-failed', r.failed_allocations.length],
    ];
    for (const [id, want, assertText] of checks) {
      const { value, text } = await shown(this.v.el(id));
      assert.equal(value, String(want), `${id} data-value`);
      if (assertText) assertText(text, value, id);
      else assert.equal(text, value, `${id} text`);
    }
    assert.equal(await this.v.value('ov-score'), String(r.score), 'score');
    assert.deepEqual((await this.findings()).map((f) => [f.severity, f.kind, f.value]),
      r.findings.map((f) => [f.severity, f.kind, String(f.bytes)]), 'findings as in the report');
    const devPeaks = await this.v.all('device-peak').evaluateAll((els) => els.map((e) => e.dataset.value));
    assert.deepEqual(devPeaks, r.devices.map((d) => String(d.peak_bytes)), 'per-device peaks');
  }
}
