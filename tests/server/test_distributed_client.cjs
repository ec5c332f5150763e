// `tessera serve` under `mpirun -np 2` (docs/distributed.md) against the official
// OpenAI client: completions and chat, streamed and not, eight clients at once; every
// greedy answer equals the one-process server's, the run stops cleanly when rank 0
// gets SIGTERM, and rank 1 killed mid-answer ends the run within 10 s, naming rank 1. Exit code 77 = skipped (no node package, no MPI build or no mpirun).
'use strict';
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const h = require('./server_helpers.cjs');

const MPIRUN = process.env.TESSERA_MPIRUN;
const why = h.missing() || (!MPIRUN ? 'this build has no MPI (libopenmpi-dev, scripts/setup.sh)'
                                    : (!fs.existsSync(MPIRUN) ? `mpirun not found at ${MPIRUN}` : null));
if (why) {
  console.log('SKIP: ' + why);
  process.exit(77);
}
const OpenAI = require(path.join(h.NODE_MODULES, 'openai'));
const MODEL = path.join(h.FIXTURES, 'models', 'qwen3moe-q8_0.gguf');
const TEMPLATE = path.join(h.FIXTURES, 'chat_templates', 'templates', 'Qwen-Qwen3-0.6B.jinja');
const ARGS = ['-m', MODEL, '--backend', 'cpu_scalar', '--threads', '1', '--parallel', '4', '--ctx', '512',
              '--chat-template', TEMPLATE];

// Two ranks on this machine; resolves like h.startServer once rank 0 listens.
function startRanks() {
  return new Promise((resolve, reject) => {
    const proc = spawn(MPIRUN, ['-np', '2', '--oversubscribe', '--bind-to', 'none', process.env.TESSERA_BIN, 'serve',
                                '--port', '0', ...ARGS], { stdio: ['ignore', 'pipe', 'pipe'], env: h.mpiEnv() });
    let out = '', err = '';
    const timer = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error('ranks did not start: ' + err)); }, 60000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve({ url: m[1], proc, stderr: () => err }); }
    });
    proc.stderr.on('data', (d) => { err += d; });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`mpirun exited (${code}): ${err}`)); });
  });
}

// The tessera child of mpirun whose environment names `rank`.
function rankPid(mpirunPid, rank = 0) {
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid !== mpirunPid) continue;
      const env = fs.readFileSync(`/proc/${name}/environ`, 'utf8').split('\0');
      if (env.includes(`OMPI_COMM_WORLD_RANK=${rank}`)) return Number(name);
    } catch (e) { /* gone, or not ours */ }
  }
  return -1;
}

const PROMPTS = ['Once upon a time', 'The capital of', 'hello world, the', 'In 1997', 'A B C D', 'xyz', 'Numbers: 1 2 3',
                 'Write a poem'];

async function answers(url) {
  const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'unused', maxRetries: 0 });
  // Eight at once: completions, half of them streamed, and two chats.
  const jobs = PROMPTS.map(async (prompt, i) => {
    if (i % 2 === 0) {
      const r = await client.completions.create({ model: 'm', prompt, max_tokens: 20, temperature: 0 });
      assert.equal(r.usage.completion_tokens, r.choices[0].finish_reason === 'length' ? 20 : r.usage.completion_tokens);
      return r.choices[0].text;
    }
    const stream = await client.completions.create({ model: 'm', prompt, max_tokens: 20, temperature: 0, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    return text;
  });
  for (const q of ['What is 2+2?', 'Say hi']) {
    jobs.push(client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: q }], max_tokens: 16,
                                                temperature: 0 }).then((r) => r.choices[0].message.content));
  }
  return Promise.all(jobs);
}

let single, ranks;
before(async () => {
  single = await h.startServer(ARGS);
  ranks = await startRanks();
});
after(async () => {
  if (single) await single.stop();
  if (ranks && ranks.proc.exitCode === null) ranks.proc.kill('SIGKILL');
});

test('two ranks answer as one process does', async () => {
  const one = await answers(single.url);
  const two = await answers(ranks.url);
  assert.equal(one.length, 10);
  assert.ok(one.some((t) => t.length > 0), 'the answers are empty');
  assert.deepEqual(two, one);
  const health = await fetch(ranks.url + '/health');
  assert.equal(health.status, 200);
});

test('SIGTERM to rank 0 stops every rank cleanly', async () => {
  const pid = rankPid(ranks.proc.pid, 0);
  assert.ok(pid > 0, 'rank 0 not found');
  const exited = new Promise((res) => {
    ranks.proc.removeAllListeners('exit');
    ranks.proc.once('exit', (code, signal) => res(signal ? `signal ${signal}` : code));
  });
  process.kill(pid, 'SIGTERM');
  assert.equal(await exited, 0, 'mpirun did not exit cleanly:\n' + ranks.stderr());
});

test('rank 1 killed mid-answer ends the run within 10 s, naming it', async () => {
  const run = await startRanks();
  const exited = new Promise((res) => {
    run.proc.removeAllListeners('exit');
    run.proc.once('exit', (code, signal) => res({ code, signal, at: Date.now() }));
  });
  // A long streamed answer; once tokens flow, rank 1 goes.
  const r = await fetch(run.url + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'hello', max_tokens: 400, temperature: 0, stream: true, ignore_eos: true }),
  });
  const reader = r.body.getReader();
  await reader.read();
  const pid = rankPid(run.proc.pid, 1);
  assert.ok(pid > 0, 'rank 1 not found');
  const killed = Date.now();
  process.kill(pid, 'SIGKILL');
  const reading = (async () => { try { while (!(await reader.read()).done); } catch (e) { /* cut off */ } })();
  const end = await exited;
  await reading;
  assert.ok(end.at - killed < 10000, `the run ended ${end.at - killed} ms after the kill`);
  assert.notEqual(end.code, 0);
  assert.match(run.stderr(), /rank 1/);
});
