// hearth serve through the official openai client (and plain fetch where the client hides the reply):
// answers at temperature 0 equal `hearth run --temp 0`'s text, alone and 8 at once; streaming chunks in
// llama.cpp's order; stop strings, max_tokens, include_usage, logprobs; an abort frees its slot; bad
// requests get 400 with the error object, a wrong key 401, a full queue 503.
// Env: BIN, MODEL, URL_A (--api-key KEY, 4 slots), KEY, URL_B (1 slot, queue 1), SLOW.
import OpenAI from 'openai';
import { execFileSync } from 'node:child_process';

const { BIN, MODEL, URL_A, URL_B, KEY } = process.env;
const SLOW = Number(process.env.SLOW || 1);
let pass = 0, fail = 0;
const ok = () => pass++;
const bad = (what) => { fail++; console.error('FAIL: ' + what); };
const check = (cond, what) => (cond ? ok() : bad(what));
const eq = (got, want, what) => check(got === want, `${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);

const api = new OpenAI({ baseURL: URL_A + '/v1', apiKey: KEY, maxRetries: 0, timeout: 120000 * SLOW });
const apiB = new OpenAI({ baseURL: URL_B + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 * SLOW });

// what `hearth run --temp 0` prints (its trailing newline is its own, not the model's)
function runText(args) {
  const out = execFileSync(BIN, ['run', '-m', MODEL, '--temp', '0', '--no-echo', ...args],
                           { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  return out.endsWith('\n') ? out.slice(0, -1) : out;
}

async function raw(url, path, init = {}) {
  const headers = { 'Content-Type': 'application/json', Authorization: 'Bearer ' + KEY, ...(init.headers || {}) };
  const r = await fetch(url + path, { ...init, headers });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

// a 400 (or other status) with {"error": {code, message, type}}
async function expectError(path, body, status, what, url = URL_A) {
  const r = await raw(url, path, { method: 'POST', body });
  const e = r.json && r.json.error;
  check(r.status === status && e && e.code === status && typeof e.message === 'string' && typeof e.type === 'string',
        `${what}: status ${r.status}, body ${r.text.slice(0, 200)}`);
}

async function slots(url = URL_A) { return (await raw(url, '/slots')).json; }
async function waitIdle(url, seconds) {
  for (let i = 0; i < seconds * 10; i++) {
    const s = await slots(url);
    if (s.every((x) => !x.is_processing)) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

const prompts = ['Once upon a time', 'The little dog', 'Lily wanted to', 'One day, a bird', 'Tom and Sue went',
                 'The sun was', 'There was a big tree', 'A girl named Amy'];
const N = 40;

async function main() {
  // health, models
  eq((await raw(URL_A, '/health')).json.status, 'ok', '/health');
  const models = await api.models.list();
  check(models.data.length === 1 && models.data[0].object === 'model', 'models.list: ' + JSON.stringify(models.data));

  // completions: the same text as run, finish_reason length at max_tokens
  const want0 = runText(['-p', prompts[0], '-n', String(N)]);
  check(want0.length > 20, 'run gave too little text to compare: ' + JSON.stringify(want0));
  const c = await api.completions.create({ model: 'm', prompt: prompts[0], max_tokens: N, temperature: 0 });
  eq(c.choices[0].text, want0, 'completion at temperature 0 = hearth run');
  eq(c.choices[0].finish_reason, 'length', 'completion finish_reason at max_tokens');
  eq(c.usage.completion_tokens, N, 'completion usage.completion_tokens');
  eq(c.object, 'text_completion', 'completion object');

  // completions streaming
  let text = '', last = null, n = 0;
  for await (const ch of await api.completions.create({ model: 'm', prompt: prompts[0], max_tokens: N, temperature: 0,
                                                        stream: true })) {
    text += ch.choices[0]?.text ?? '';
    if (ch.choices[0]?.finish_reason) last = ch.choices[0].finish_reason;
    n++;
  }
  eq(text, want0, 'streamed completion = hearth run');
  eq(last, 'length', 'streamed completion finish_reason');
  check(n > 10, `streamed completion came in ${n} chunks`);

  // stop string: a piece of the expected text ends the answer just before it
  const stop = want0.slice(12, 16);
  const cut = want0.slice(0, want0.indexOf(stop));
  const s1 = await api.completions.create({ model: 'm', prompt: prompts[0], max_tokens: N, temperature: 0, stop: [stop] });
  eq(s1.choices[0].text, cut, `stop ${JSON.stringify(stop)}`);
  eq(s1.choices[0].finish_reason, 'stop', 'finish_reason at a stop string');
  let st = '';
  for await (const ch of await api.completions.create({ model: 'm', prompt: prompts[0], max_tokens: N, temperature: 0,
                                                        stop, stream: true }))
    st += ch.choices[0]?.text ?? '';
  eq(st, cut, 'streamed, stop as a string');

  // chat: the same text as run --chat
  const wantChat = runText(['--chat', '-p', 'Tell me a story.', '-n', '24']);
  const cc = await api.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'Tell me a story.' }],
                                                 max_tokens: 24, temperature: 0 });
  eq(cc.choices[0].message.content, wantChat, 'chat at temperature 0 = hearth run --chat');
  eq(cc.choices[0].message.role, 'assistant', 'chat message role');
  eq(cc.object, 'chat.completion', 'chat object');

  // chat streaming with include_usage: role chunk, deltas, finish chunk, usage chunk with no choices
  const chunks = [];
  for await (const ch of await api.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'Tell me a story.' }], max_tokens: 24, temperature: 0,
    stream: true, stream_options: { include_usage: true } }))
    chunks.push(ch);
  eq(chunks[0].choices[0].delta.role, 'assistant', 'first chunk: the role');
  const fin = chunks.findIndex((ch) => ch.choices[0]?.finish_reason);
  check(fin === chunks.length - 2, `finish chunk second to last (at ${fin} of ${chunks.length})`);
  const u = chunks[chunks.length - 1];
  check(u.choices.length === 0 && u.usage && u.usage.total_tokens === u.usage.prompt_tokens + u.usage.completion_tokens &&
        u.usage.completion_tokens > 0, 'usage chunk: ' + JSON.stringify(u));
  eq(chunks.map((ch) => ch.choices[0]?.delta?.content ?? '').join(''), wantChat, 'streamed chat = hearth run --chat');
  check(chunks.every((ch) => ch.object === 'chat.completion.chunk' && ch.id === chunks[0].id), 'chunk objects and ids');
  check(chunks[fin].timings && chunks[fin].timings.predicted_n > 0, 'timings in the finish chunk');

  // logprobs: one entry per token, top alternatives sorted, the greedy pick at the top
  const lp = await api.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6,
                                                 temperature: 0, logprobs: true, top_logprobs: 3, ignore_eos: true });
  const content = lp.choices[0].logprobs?.content ?? [];
  check(content.length === 6 && content.every((t) => t.top_logprobs.length === 3 &&
        t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6),
        'logprobs: ' + JSON.stringify(content).slice(0, 300));

  // 8 concurrent streaming clients (4 slots: half wait in the queue), each gets run's text
  const wants = prompts.map((p) => runText(['-p', p, '-n', String(N)]));
  const got = await Promise.all(prompts.map(async (p) => {
    let t = '';
    for await (const ch of await api.completions.create({ model: 'm', prompt: p, max_tokens: N, temperature: 0,
                                                          stream: true }))
      t += ch.choices[0]?.text ?? '';
    return t;
  }));
  prompts.forEach((p, i) => eq(got[i], wants[i], `concurrent client ${i} (${p})`));

  // abort mid-stream (on B, whose long context would keep the request running for seconds): the slot is
  // busy, then free again at once
  const ac = new AbortController();
  const stream = await apiB.completions.create({ model: 'm', prompt: 'Once', max_tokens: 100000, temperature: 0.8,
                                                 ignore_eos: true, stream: true }, { signal: ac.signal });
  let k = 0, busy = false;
  try {
    for await (const ch of stream) {
      if (++k === 3) { busy = (await slots(URL_B)).some((x) => x.is_processing); ac.abort(); }
    }
  } catch (e) { /* the abort */ }
  check(busy, 'a slot was busy while streaming');
  check(await waitIdle(URL_B, 2 * SLOW), 'after the abort every slot is free: ' + JSON.stringify(await slots(URL_B)));

  // bad requests: 400 with the error object
  await expectError('/v1/chat/completions', '{"messages": [', 400, 'bad JSON');
  await expectError('/v1/chat/completions', '[1, 2]', 400, 'not an object');
  await expectError('/v1/chat/completions', '{"messages": "hi"}', 400, 'messages not an array');
  await expectError('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'hi' }],
                                                             temperature: 'hot' }), 400, 'temperature a string');
  await expectError('/v1/completions', JSON.stringify({ prompt: 'hi', max_tokens: -5 }), 400, 'negative max_tokens');
  await expectError('/v1/completions', JSON.stringify({ prompt: 'hi', stop: [1] }), 400, 'stop not strings');
  await expectError('/v1/completions', JSON.stringify({ prompt: 42 }), 400, 'prompt a number');
  await expectError('/v1/completions', JSON.stringify({ prompt: 'hi', n: 2 }), 400, 'n = 2');
  await expectError('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'hi' }],
                    tools: [{ type: 'function', function: { name: 'f' } }] }), 400, 'tools');
  await expectError('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'hi' }],
                    response_format: { type: 'json_schema' } }), 400, 'response_format json_schema');
  await expectError('/v1/completions', JSON.stringify({ prompt: 'word '.repeat(3000) }), 400, 'over-long prompt');
  try {
    await api.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], temperature: 'x' });
    bad('the client accepted a bad request');
  } catch (e) {
    check(e.status === 400 && e.error && e.error.type === 'invalid_request_error', 'client sees 400: ' + e);
  }
  // unknown fields are ignored
  const unk = await raw(URL_A, '/v1/completions', { method: 'POST', body: JSON.stringify({ prompt: 'hi', max_tokens: 2,
                                                                                          foo: { bar: 1 } }) });
  eq(unk.status, 200, 'unknown fields ignored');

  // the API key
  const wrong = new OpenAI({ baseURL: URL_A + '/v1', apiKey: 'wrong', maxRetries: 0 });
  try {
    await wrong.completions.create({ model: 'm', prompt: 'hi', max_tokens: 2 });
    bad('a wrong key was accepted');
  } catch (e) {
    check(e.status === 401 && e.error && e.error.type === 'authentication_error', 'wrong key: 401: ' + e);
  }
  eq((await raw(URL_A, '/v1/models', { headers: { Authorization: '' } })).status, 401, 'no key: 401');

  // tokenize / detokenize round trip
  const tk = await raw(URL_A, '/tokenize', { method: 'POST', body: JSON.stringify({ content: 'Once upon a time' }) });
  check(tk.status === 200 && tk.json.tokens.length > 2, '/tokenize: ' + tk.text);
  const dt = await raw(URL_A, '/detokenize', { method: 'POST', body: JSON.stringify({ tokens: tk.json.tokens }) });
  eq(dt.json && dt.json.content.trim(), 'Once upon a time', '/detokenize');

  // metrics: counters moved, histograms present
  const m = (await raw(URL_A, '/metrics')).text;
  const metric = (name) => Number((m.match(new RegExp('^hearth:' + name + ' (\\S+)$', 'm')) || [])[1]);
  check(metric('tokens_predicted_total') > 8 * N && metric('prompt_tokens_total') > 0, 'metrics counters');
  check(/hearth:time_to_first_token_seconds_bucket\{le="\+Inf"\} \d+/.test(m) &&
        /hearth:inter_token_latency_seconds_count \d+/.test(m) && /hearth:queue_time_seconds_sum/.test(m),
        'metrics histograms');

  // a full queue: server B has one slot and room for one waiting request
  const hold = [new AbortController(), new AbortController()];
  const longReq = (i) => apiB.completions.create({ model: 'm', prompt: 'Once', max_tokens: 100000, ignore_eos: true,
                                                   stream: true }, { signal: hold[i].signal });
  const s0 = await longReq(0);
  const it0 = s0[Symbol.asyncIterator]();
  await it0.next();  // running
  // queued: its stream is open at once, and gets comment pings while it waits
  const s1p = fetch(URL_B + '/v1/completions', { method: 'POST', signal: hold[1].signal,
    headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ prompt: 'hi', max_tokens: 4, stream: true }) });
  let deferred = 0;
  for (let i = 0; i < 50 * SLOW && deferred < 1; i++) {
    deferred = Number(((await raw(URL_B, '/metrics')).text.match(/^hearth:requests_deferred (\S+)$/m) || [])[1]);
    await new Promise((r) => setTimeout(r, 100));
  }
  eq(deferred, 1, 'one request waiting');
  const full = await raw(URL_B, '/v1/completions', { method: 'POST', body: JSON.stringify({ prompt: 'hi' }) });
  check(full.status === 503 && full.json?.error?.code === 503 && full.headers.get('retry-after'),
        'full queue: 503 with Retry-After: ' + full.status + ' ' + full.text);
  let pinged = '';
  try {
    const rd = (await s1p).body.getReader();
    const t0 = Date.now();
    while (!pinged.includes(': ping') && Date.now() - t0 < 5000 * SLOW)
      pinged += new TextDecoder().decode((await rd.read()).value);
  } catch (e) { pinged += String(e); }
  check(pinged.includes(': ping\n\n') && !pinged.includes('data:'),
        'a waiting stream gets comment pings: ' + JSON.stringify(pinged));
  hold[0].abort();
  hold[1].abort();
  await s1p.catch(() => {});
  check(await waitIdle(URL_B, 10 * SLOW), 'server B idle after the aborts');
  const after = await apiB.completions.create({ model: 'm', prompt: 'hi', max_tokens: 3 });
  eq(after.usage.completion_tokens, 3, 'server B answers again');

  // a client that goes away while waiting for a whole (not streamed) answer cancels it too
  const ac2 = new AbortController();
  const gone = apiB.completions.create({ model: 'm', prompt: 'Once', max_tokens: 100000, ignore_eos: true },
                                       { signal: ac2.signal }).catch(() => 'aborted');
  let running = false;
  for (let i = 0; i < 50 * SLOW && !running; i++) {
    running = (await slots(URL_B)).some((x) => x.is_processing);
    if (!running) await new Promise((r) => setTimeout(r, 50));
  }
  ac2.abort();
  eq(await gone, 'aborted', 'the request was aborted');
  check(running && await waitIdle(URL_B, 2 * SLOW), 'a non-streamed request is cancelled when its client goes away');
}

try {
  await main();
} catch (e) {
  bad('exception: ' + (e.stack || e));
}
console.log(`serve api: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
