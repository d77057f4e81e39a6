// hearth serve's web chat in headless Chromium: the page loads, a message sent with Enter gets an answer
// that streams in (several updates before it is complete) with tokens/s; the markdown renderer makes no
// tags from the model's text but its own; Stop ends an answer and frees the slot; a phone-wide window
// does not scroll sideways. Env: URL, CHROMIUM, SHOT (screenshot path), SLOW.
import puppeteer from 'puppeteer-core';

const { URL: BASE, CHROMIUM, SHOT } = process.env;
const SLOW = Number(process.env.SLOW || 1);
let pass = 0, fail = 0;
const check = (cond, what) => (cond ? pass++ : (fail++, console.error('FAIL: ' + what)));

const browser = await puppeteer.launch({
  executablePath: CHROMIUM, headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'] });
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 900, height: 640 });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(BASE + '/', { waitUntil: 'networkidle0', timeout: 30000 * SLOW });
  check((await page.title()) === 'hearth', 'title');
  await page.waitForFunction(() => document.getElementById('model').textContent.length > 0, { timeout: 10000 * SLOW });

  // count how often the answer changes while it streams
  await page.evaluate(() => {
    window.updates = 0;
    new MutationObserver((recs) => { window.updates += recs.length; }).observe(document.getElementById('log'),
                                                         { childList: true, subtree: true, characterData: true });
  });
  await page.evaluate(() => {  // a short, repeatable answer
    document.getElementById('temperature').value = '0';
    document.getElementById('max_tokens').value = '60';
    document.getElementById('system').value = 'You tell short stories.';
  });
  await page.type('#input', 'Tell me a story about a dog.');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => {
    const a = document.querySelector('.msg.assistant .stats');
    return a && /tok\/s/.test(a.textContent) && document.getElementById('stop').disabled;
  }, { timeout: 60000 * SLOW });
  const answer = await page.$eval('.msg.assistant', (e) => e.textContent);
  const updates = await page.evaluate(() => window.updates);
  check(answer.length > 20, 'an answer appeared: ' + JSON.stringify(answer));
  check(updates > 5, `the answer streamed in (${updates} updates)`);
  check(/\d+ tokens, [\d.]+ tok\/s/.test(answer), 'tokens/s shown: ' + answer.slice(-80));
  if (SHOT) await page.screenshot({ path: SHOT });

  // the renderer: the model's text never becomes tags of its own
  const md = await page.evaluate(() => {
    const d = document.createElement('div');
    d.innerHTML = markdown('<img src=x onerror="window.pwned=1"> **bold** `a<b>` [x](javascript:alert(1))\n' +
                           '```js\n<script>window.pwned=1</script>\n```\n- one\n- two');
    document.body.appendChild(d);
    const r = { img: d.querySelectorAll('img').length, script: d.querySelectorAll('script').length,
                a: d.querySelectorAll('a').length, strong: d.querySelectorAll('strong').length,
                pre: d.querySelectorAll('pre code').length, li: d.querySelectorAll('li').length,
                code: d.querySelector('p code') && d.querySelector('p code').textContent };
    d.remove();
    return r;
  });
  check(md.img === 0 && md.script === 0 && md.a === 0, 'no tags from the text: ' + JSON.stringify(md));
  check(md.strong === 1 && md.pre === 1 && md.li === 2 && md.code === 'a<b>', 'markdown rendered: ' + JSON.stringify(md));
  check(!(await page.evaluate(() => window.pwned)), 'no script ran');

  // Stop: a long answer is cut off and the server's slot is free again
  await page.evaluate(() => {
    document.getElementById('temperature').value = '1';
    document.getElementById('max_tokens').value = '100000';
    document.getElementById('system').value = '';
  });
  await page.type('#input', 'Tell me a very long story.');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => !document.getElementById('stop').disabled, { timeout: 10000 * SLOW });
  await page.click('#stop');
  await page.waitForFunction(() => document.getElementById('stop').disabled, { timeout: 10000 * SLOW });
  let idle = false;
  for (let i = 0; i < 50 * SLOW && !idle; i++) {
    const s = await (await fetch(BASE + '/slots')).json();
    idle = s.every((x) => !x.is_processing);
    if (!idle) await new Promise((r) => setTimeout(r, 100));
  }
  check(idle, 'Stop freed the slot');

  // a phone: nothing wider than the screen
  await page.setViewport({ width: 375, height: 700, isMobile: true });
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  check(wide <= 375, `phone width: the page is ${wide}px wide`);
  check(errors.length === 0, 'page errors: ' + errors.join('; '));
} catch (e) {
  fail++;
  console.error('FAIL: exception: ' + (e.stack || e));
} finally {
  await browser.close();
}
console.log(`serve web: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
