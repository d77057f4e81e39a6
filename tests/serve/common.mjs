// Shared by the serve tests' scripts (api.mjs, cluster.mjs): counting checks, `hearth run --temp 0`'s
// text, and concurrent streaming clients compared with it.
import { execFileSync } from 'node:child_process';

export const counts = { pass: 0, fail: 0 };
export const ok = () => counts.pass++;
export const bad = (what) => { counts.fail++; console.error('FAIL: ' + what); };
export const check = (cond, what) => (cond ? ok() : bad(what));
export const eq = (got, want, what) =>
  check(got === want, `${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);

// what `hearth run --temp 0` prints on this device alone (its trailing newline is its own, not the model's)
export function runText(bin, model, args) {
  const out = execFileSync(bin, ['run', '-m', model, '--temp', '0', '--no-echo', ...args],
                           { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  return out.endsWith('\n') ? out.slice(0, -1) : out;
}

export const prompts = ['Once upon a time', 'The little dog', 'Lily wanted to', 'One day, a bird', 'Tom and Sue went',
                        'The sun was', 'There was a big tree', 'A girl named Amy'];

// one streaming client per prompt, all at once, n tokens each at temperature 0: each gets run's text
export async function concurrentStreams(api, bin, model, ps, n) {
  const wants = ps.map((p) => runText(bin, model, ['-p', p, '-n', String(n)]));
  const got = await Promise.all(ps.map(async (p) => {
    let text = '';
    for await (const ch of await api.completions.create({ model: 'm', prompt: p, max_tokens: n, temperature: 0,
                                                          stream: true }))
      text += ch.choices[0]?.text ?? '';
    return text;
  }));
  ps.forEach((p, i) => eq(got[i], wants[i], `concurrent client ${i} (${p})`));
}

// runs main, counts an exception as a failure, prints the counts and exits with them
export async function finish(name, main) {
  try {
    await main();
  } catch (e) {
    bad('exception: ' + (e.stack || e));
  }
  console.log(`${name}: ${counts.pass} passed, ${counts.fail} failed`);
  process.exit(counts.fail ? 1 : 0);
}
