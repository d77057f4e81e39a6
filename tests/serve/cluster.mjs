// hearth serve on a cluster's head (tests/test-serve.sh starts it over loopback workers, tensor parallel
// or a pipeline): concurrent streaming clients at temperature 0 each get exactly `hearth run --temp 0`'s
// text (one device) for its prompt; a prompt already in a busy slot's cache is copied to another slot on
// every device (KV_COPY) and answered as alone; /metrics counts the bytes of every device's links.
// Env: BIN, MODEL, URL (4 slots), DEVICES (head and workers), CLIENTS (default 8), SLOW.
import OpenAI from 'openai';
import { check, concurrentStreams, eq, finish, prompts, runText } from './common.mjs';

const { BIN, MODEL, URL } = process.env;
const SLOW = Number(process.env.SLOW || 1);
const DEVICES = Number(process.env.DEVICES);
const CLIENTS = Number(process.env.CLIENTS || 8);

const api = new OpenAI({ baseURL: URL + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 * SLOW });

// hearth:cluster_bytes_{sent,received}_total per device
async function links() {
  const text = await (await fetch(URL + '/metrics')).text();
  const out = { sent: {}, received: {} };
  for (const m of text.matchAll(/^hearth:cluster_bytes_(sent|received)_total\{device="([^"]*)"\} (\d+)$/gm))
    out[m[1]][m[2]] = Number(m[3]);
  return out;
}

async function main() {
  // CLIENTS concurrent streams on 4 slots (the rest queue): each one's text is run's for its prompt
  const ps = Array.from({ length: CLIENTS }, (_, i) => prompts[i % prompts.length]);
  await concurrentStreams(api, BIN, MODEL, ps, 40);

  // the scheduler refreshes them once a second and when it goes idle: after the streams, soon
  let before = await links();
  for (let i = 0; i < 50 * SLOW && Object.keys(before.sent).length < DEVICES; i++) {
    await new Promise((r) => setTimeout(r, 100));
    before = await links();
  }
  const names = Object.keys(before.sent);
  check(names.length === DEVICES && names.includes('head') && names.every((d) => before.sent[d] > 0 &&
        before.received[d] > 0), `link bytes per device: ${JSON.stringify(before)}`);

  // a prefix copied between slots on every device: A holds its slot (a long answer); B, the same prompt,
  // arrives while A runs, so it takes another slot and copies A's prompt there; B's text is run's
  const p = 'Once upon a time, there was a little girl named Lily. She loved to play';
  const wantB = runText(BIN, MODEL, ['-p', p, '-n', '20']);
  let aDone = false;
  const a = await api.completions.create({ model: 'm', prompt: p, max_tokens: 300, temperature: 0, stream: true,
                                          ignore_eos: true });
  const it = a[Symbol.asyncIterator]();
  await it.next();  // A's prompt is in its slot's cache now
  const aRest = (async () => { while (!(await it.next()).done); aDone = true; })();
  const b = await api.completions.create({ model: 'm', prompt: p, max_tokens: 20, temperature: 0 });
  const bWhileA = !aDone;
  eq(b.choices[0].text, wantB, 'a prompt copied from a busy slot');
  check(bWhileA && b.timings?.cache_n > 0,
        `the copy: A still running when B ended: ${bWhileA}, B's cached tokens ${b.timings?.cache_n}`);
  await aRest;

  // the counters grow with the traffic (refreshed by the scheduler when it goes idle)
  let after = before;
  for (let i = 0; i < 50 * SLOW && !(after.sent.head > before.sent.head); i++) {
    await new Promise((r) => setTimeout(r, 100));
    after = await links();
  }
  check(names.every((d) => after.sent[d] > before.sent[d] && after.received[d] > before.received[d]),
        `link bytes grow: before ${JSON.stringify(before)}, after ${JSON.stringify(after)}`);

  const slots = await (await fetch(URL + '/slots')).json();
  check(slots.length === 4 && slots.every((s) => !s.is_processing), `slots free at the end: ${JSON.stringify(slots)}`);
}

await finish('cluster.mjs', main);
