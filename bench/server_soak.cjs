// The two sides of scripts/soak.sh, run as separate processes so the abuse does not
// slow the measuring client's own event loop:
//   node bench/server_soak.cjs good URL SECONDS [clients=8] [max_tokens=32]
//     well-behaved streaming clients, each sending requests one after the other for
//     SECONDS (or, with SOAK_UNTIL_FILE, until that file says "bursts done"); prints
//     one JSON line: {requests, failures, seconds, ttft_ms: [...]}.
//   node bench/server_soak.cjs abuse URL [slowloris=500] [malformed=1000] [disconnects=200]
//     holds `slowloris` connections that send a request head a byte every 2 s (and
//     reconnect when cut), sends `malformed` bad or oversized requests (20 at a time)
//     and `disconnects` streaming requests whose client leaves after the first chunk
//     (4 at a time); prints "ready" once the slow connections are open, "bursts done"
//     when the malformed and disconnecting requests are all sent, and on SIGTERM one
//     JSON line of counts.
// 127.0.0.1 only; every loop is bounded by its count or by SECONDS.
'use strict';
const fs = require('node:fs');
const net = require('node:net');

const [mode, url, ...rest] = process.argv.slice(2);
if (!['good', 'abuse'].includes(mode) || !url) {
  console.error('usage: node bench/server_soak.cjs good URL SECONDS [clients] [max_tokens] | abuse URL [slowloris] [malformed] [disconnects]');
  process.exit(2);
}
const { hostname, port } = new URL(url);
if (hostname !== '127.0.0.1' && hostname !== 'localhost') {
  console.error('server_soak: only against 127.0.0.1');
  process.exit(2);
}
const words = 'the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you were her she there one all we their has been would when who will more if no out so said what up its about into than them can only other new some could time these two may then do first any my now such like our over man'.split(' ');
function prompt(seed) {
  let x = (seed * 2654435761) % 4294967296;
  const out = [];
  for (let i = 0; i < 40; ++i) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out.push(words[x % words.length]);
  }
  return out.join(' ');
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- good clients ----
async function goodRequest(seed, maxTokens) {
  const t0 = performance.now();
  const r = await fetch(url + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: prompt(seed), max_tokens: maxTokens, temperature: 0.7, seed, ignore_eos: true,
                           stream: true }),
  });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}`);
  const dec = new TextDecoder();
  let buf = '', ttft = null, done = false;
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (ev === 'data: [DONE]') done = true;
      else if (ttft === null && ev.startsWith('data: ') && JSON.parse(ev.slice(6)).choices[0]?.text) ttft = performance.now() - t0;
    }
  }
  if (!done) throw new Error('the stream ended without [DONE]');
  return ttft ?? performance.now() - t0;
}

// SOAK_UNTIL_FILE: run until that file holds "bursts done" (at most SECONDS).
async function good(seconds, clients = 8, maxTokens = 32) {
  const start = Date.now(), end = start + seconds * 1000;
  const until = process.env.SOAK_UNTIL_FILE;
  const over = () => Date.now() >= end ||
    (until && fs.existsSync(until) && fs.readFileSync(until, 'utf8').includes('bursts done'));
  const ttft = [];
  let requests = 0, failures = 0;
  const errors = new Set();
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    for (let k = 0; !over(); ++k) {
      ++requests;
      try {
        ttft.push(await goodRequest(c * 1000 + k, maxTokens));
      } catch (e) {
        ++failures;
        errors.add(String(e.message || e));
      }
    }
  }));
  console.log(JSON.stringify({ requests, failures, seconds: Math.round((Date.now() - start) / 100) / 10,
                               errors: [...errors].slice(0, 5), ttft_ms: ttft.map((t) => Math.round(t * 10) / 10) }));
}

// ---- abuse ----
const counts = { slowloris_connections: 0, slowloris_cut: 0, malformed_sent: 0, malformed_status: {},
                 disconnects: 0, disconnect_errors: 0 };
let stopping = false;

function slowLoris() {
  return new Promise((resolveOpen) => {
    let opened = false;
    const open = () => {
      if (stopping) return;
      const sock = net.connect(Number(port), hostname);
      let timer = null;
      sock.on('connect', () => {
        ++counts.slowloris_connections;
        if (!opened) { opened = true; resolveOpen(sock); }
        sock.write('POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ');
        timer = setInterval(() => { if (!sock.destroyed) sock.write('a'); }, 2000);
      });
      sock.on('error', () => {});
      sock.on('close', () => {
        clearInterval(timer);
        if (!opened) { opened = true; resolveOpen(null); }
        if (!stopping) { ++counts.slowloris_cut; setTimeout(open, 100); }
      });
      slowSockets.add(sock);
      sock.on('close', () => slowSockets.delete(sock));
    };
    open();
  });
}
const slowSockets = new Set();

const bad = [
  () => 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n{{{{{',
  () => 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\n\r\n{"prompt":',
  () => 'GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ' + 'b'.repeat(40000) + '\r\n\r\n',
  () => 'GET /health HTTP/1.1\r\n' + Array.from({ length: 300 }, (_, i) => `X-H${i}: ${i}`).join('\r\n') + '\r\n\r\n',
  () => 'BLAH\0\0\0 / HTTP/9.9\r\n\r\n',
  () => { const b = JSON.stringify({ prompt: 'x', max_tokens: 'many', temperature: 7 });
          return `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${b.length}\r\n\r\n${b}`; },
  () => { const b = JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(20000) }], n: 3 });
          return `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${b.length}\r\n\r\n${b}`; },
  () => 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n' + ('4000\r\n' + 'z'.repeat(16384) + '\r\n').repeat(128),
  () => 'GET /' + 'u'.repeat(20000) + ' HTTP/1.1\r\n\r\n',
  () => 'GET /no/such/path HTTP/1.1\r\nHost: x\r\n\r\n',
];
function sendBad(i) {
  return new Promise((resolve) => {
    const sock = net.connect(Number(port), hostname);
    let reply = '';
    const timer = setTimeout(() => sock.destroy(), 15000);
    sock.on('connect', () => { sock.end(bad[i % bad.length]()); });
    sock.on('data', (d) => { if (reply.length < 64) reply += d; });
    sock.on('error', () => {});
    sock.on('close', () => {
      clearTimeout(timer);
      const st = (reply.match(/^HTTP\/1\.1 (\d+)/) || [])[1] || 'none';
      counts.malformed_status[st] = (counts.malformed_status[st] || 0) + 1;
      ++counts.malformed_sent;
      resolve();
    });
  });
}

function disconnectMidStream(seed) {
  return new Promise((resolve) => {
    const sock = net.connect(Number(port), hostname);
    const b = JSON.stringify({ prompt: prompt(seed + 777777), max_tokens: 200, ignore_eos: true, stream: true });
    let got = '';
    const timer = setTimeout(() => { ++counts.disconnect_errors; sock.destroy(); }, 30000);
    sock.on('connect', () => sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${b.length}\r\n\r\n${b}`));
    sock.on('data', (d) => {
      got += d;
      if (/"text":"[^"]/.test(got)) { ++counts.disconnects; sock.destroy(); }  // the first token came: leave
    });
    sock.on('error', () => {});
    sock.on('close', () => { clearTimeout(timer); resolve(); });
  });
}

async function pool(n, width, fn) {
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (!stopping && next < n) await fn(next++);
  }));
}

async function abuse(nSlow = 500, nBad = 1000, nDisc = 200) {
  const stop = () => {
    if (stopping) return;
    stopping = true;
    for (const s of slowSockets) s.destroy();
  };
  process.on('SIGTERM', stop);
  for (let i = 0; i < nSlow; i += 50) await Promise.all(Array.from({ length: Math.min(50, nSlow - i) }, slowLoris));
  console.log('ready');
  const t0 = Date.now();
  await Promise.all([pool(nBad, 20, sendBad), pool(nDisc, 4, disconnectMidStream)]);
  counts.bursts_seconds = Math.round((Date.now() - t0) / 100) / 10;
  console.log('bursts done');
  while (!stopping) await sleep(100);
  console.log(JSON.stringify(counts));
  process.exit(0);
}

if (mode === 'good') good(Number(rest[0] || 20), Number(rest[1] || 8), Number(rest[2] || 32));
else abuse(Number(rest[0] || 500), Number(rest[1] || 1000), Number(rest[2] || 200));
