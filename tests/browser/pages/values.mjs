// Numbers as the page shows them. Every number the viewer shows carries its raw value in
// `data-value` (the same number as in `gpucollect report --format json`) next to the text people
// read. Specs compare the raw value with the report, and check that the text stands for that
// value, to the precision it shows: the format itself is the page's (analysis_core::units), not
// recomputed here.
import assert from 'node:assert/strict';

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];

/** The raw value and the text of a number element (a `Bytes` or `Duration` of the viewer). */
export async function shown(locator) {
  return { value: await locator.getAttribute('data-value'), text: (await locator.textContent()).trim() };
}

const decimals = (s) => (s.includes('.') ? s.split('.')[1].length : 0);

/** Asserts that `text` (e.g. "1.25 MiB", "-3.0 KiB", "+12 B") stands for `bytes`: the same sign,
 * the largest unit under which the number is at least 1, and equal to the precision shown. */
export function assertBytesText(text, bytes, what = 'bytes') {
  const m = /^([+-]?)(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB|PiB|EiB)$/.exec(text);
  assert.ok(m, `${what}: "${text}" reads as a byte count`);
  const [, sign, num, unit] = m;
  const want = Number(bytes);
  assert.equal(sign === '-', want < 0, `${what}: "${text}" has the sign of ${want}`);
  const k = BYTE_UNITS.indexOf(unit);
  const scale = 1024 ** k;
  const n = Number(num);
  if (k > 0) assert.ok(n >= 1 && n < 1024, `${what}: "${text}" is in the unit that fits`);
  const tolerance = 0.5 * 10 ** -decimals(num) * scale + 1e-9 * scale;
  assert.ok(Math.abs(n * scale - Math.abs(want)) <= tolerance, `${what}: "${text}" stands for ${want} bytes`);
}

/** Asserts that `text` (e.g. "950 ns", "12.500 µs", "3.25 s", "2 min 5 s", "3 h 2 min") stands
 * for `nanos`, to the precision shown. */
export function assertDurationText(text, nanos, what = 'duration') {
  const want = Number(nanos);
  let m;
  if ((m = /^(\d+) min (\d+) s$/.exec(text))) {
    const s = Number(m[1]) * 60 + Number(m[2]);
    assert.ok(want >= s * 1e9 && want < (s + 1) * 1e9, `${what}: "${text}" stands for ${want} ns`);
  } else if ((m = /^(\d+) h (\d+) min$/.exec(text))) {
    const s = Number(m[1]) * 3600 + Number(m[2]) * 60;
    assert.ok(want >= s * 1e9 && want < (s + 60) * 1e9, `${what}: "${text}" stands for ${want} ns`);
  } else {
    m = /^(\d+(?:\.\d+)?) (ns|µs|ms|s)$/.exec(text);
    assert.ok(m, `${what}: "${text}" reads as a duration`);
    const scale = { ns: 1, µs: 1e3, ms: 1e6, s: 1e9 }[m[2]];
    const tolerance = 0.5 * 10 ** -decimals(m[1]) * scale + 1e-9 * scale;
    assert.ok(Math.abs(Number(m[1]) * scale - want) <= tolerance, `${what}: "${text}" stands for ${want} ns`);
  }
}
