// The server under misbehaving clients and at shutdown: request size limits (413,
// 431), slow requests (408), the connection bound (503), a non-streaming request
// whose client disconnects (cancelled, its slot and pages freed), --max-tokens-limit,
// and SIGTERM during streaming requests (every stream ends with a final chunk and
// [DONE]; exit 0 within --shutdown-timeout; /health says draining meanwhile).
// Exit code 77 = skipped.
'use strict';
const { test } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const path = require('node:path');
const h = require('./server_helpers.cjs');

const why = h.missing();
if (why) {
  console.log('SKIP: ' + why);
  process.exit(77);
}
const MODEL = path.join(h.FIXTURES, 'models', 'llama-q8_0.gguf');

// Sends raw bytes on a new connection; resolves to everything the server sent back
// before it closed (or `timeoutMs` passed). `hold`: keep our side open after sending.
function raw(url, bytes, { timeoutMs = 5000 } = {}) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const sock = net.connect(Number(port), hostname);
    let out = '';
    const timer = setTimeout(() => { sock.destroy(); resolve(out); }, timeoutMs);
    sock.on('data', (d) => { out += d; });
    sock.on('error', () => {});
    sock.on('close', () => { clearTimeout(timer); resolve(out); });
    sock.write(bytes);
  });
}
const status = (reply) => Number((reply.match(/^HTTP\/1\.1 (\d+)/) || [])[1]);

function request(method, pathname, headers, body = '') {
  const lines = [`${method} ${pathname} HTTP/1.1`, 'Host: x', ...headers];
  if (body) lines.push('Content-Type: application/json', `Content-Length: ${Buffer.byteLength(body)}`);
  return lines.join('\r\n') + '\r\n\r\n' + body;
}

test('limits: body (413), header bytes and lines (431), a slow request (408)', async () => {
  const s = await h.startServer(['-m', MODEL, '--threads', '1', '--max-body', '4K', '--max-header-bytes', '2048',
                                 '--max-headers', '20', '--read-timeout', '1']);
  try {
    // Announced too large: refused before the body is read.
    let r = await raw(s.url, request('POST', '/v1/completions', ['Content-Type: application/json',
                                                                 'Content-Length: 100000000'], '') + '{');
    assert.equal(status(r), 413, r);
    assert.match(r, /request_too_large/);
    // Sent whole, larger than --max-body.
    const big = JSON.stringify({ prompt: 'x'.repeat(5000), max_tokens: 1 });
    r = await raw(s.url, request('POST', '/v1/completions', [], big));
    assert.equal(status(r), 413, r);
    // Chunked: the size is known only while reading.
    const chunk = 'a'.repeat(1024);
    let chunked = request('POST', '/v1/completions', ['Content-Type: application/json', 'Transfer-Encoding: chunked']);
    for (let i = 0; i < 80; ++i) chunked += '400\r\n' + chunk + '\r\n';
    r = await raw(s.url, chunked + '0\r\n\r\n');
    assert.equal(status(r), 413, r);
    r = await raw(s.url, request('GET', '/health', ['X-Big: ' + 'b'.repeat(3000)]));
    assert.equal(status(r), 431, r);
    assert.match(r, /--max-header-bytes/);
    r = await raw(s.url, request('GET', '/health', Array.from({ length: 30 }, (_, i) => `X-H${i}: 1`)));
    assert.equal(status(r), 431, r);
    assert.match(r, /--max-headers/);
    r = await raw(s.url, 'GET /' + 'a'.repeat(4000));  // a request line that never ends
    assert.equal(status(r), 431, r);
    // Slow loris: half a request, then nothing; cut at --read-timeout (1 s).
    const t0 = Date.now();
    r = await raw(s.url, 'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ', { timeoutMs: 5000 });
    assert.equal(status(r), 408, r);
    assert.ok(Date.now() - t0 < 3000, `the slow request held its connection ${Date.now() - t0} ms`);
    // Within the limits all is well.
    r = await raw(s.url, request('POST', '/v1/completions', ['Connection: close'],
                                 JSON.stringify({ prompt: 'x', max_tokens: 2 })));
    assert.equal(status(r), 200, r);
    assert.ok(await h.metric(s.url, 'tessera_http_requests_refused_total') >= 7);
  } finally {
    const code = await s.stop();
    assert.equal(code, 0, 'the server did not shut down cleanly:\n' + s.stderr());
  }
});

test('--max-connections: connections beyond the bound get 503 at once', async () => {
  const s = await h.startServer(['-m', MODEL, '--threads', '1', '--max-connections', '3']);
  const { hostname, port } = new URL(s.url);
  const idle = [];
  try {
    for (let i = 0; i < 3; ++i) {  // three connections that send nothing
      const c = net.connect(Number(port), hostname);
      c.on('error', () => {});
      await new Promise((res) => c.on('connect', res));
      idle.push(c);
    }
    assert.ok(await h.waitFor(async () => {
      const r = await raw(s.url, request('GET', '/health', []), { timeoutMs: 2000 });
      return status(r) === 503 && /too_many_connections/.test(r);
    }, 5000), 'no 503 beyond --max-connections');
    for (const c of idle) c.destroy();
    // Once they are gone, connections are served again.
    assert.ok(await h.waitFor(async () => (await fetch(s.url + '/health')).status === 200, 5000));
  } finally {
    for (const c of idle) c.destroy();
    const code = await s.stop();
    assert.equal(code, 0, 'the server did not shut down cleanly:\n' + s.stderr());
  }
});

test('--max-tokens-limit lowers max_tokens -1 and larger values', async () => {
  const s = await h.startServer(['-m', MODEL, '--threads', '1', '--ctx', '1024', '--max-tokens-limit', '40']);
  try {
    for (const max_tokens of [-1, 500]) {
      const r = await h.postJson(s.url + '/v1/completions', { prompt: 'x', max_tokens, ignore_eos: true, temperature: 0 });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.usage.completion_tokens, 40);
      assert.equal(r.json.choices[0].finish_reason, 'length');
    }
  } finally {
    const code = await s.stop();
    assert.equal(code, 0, 'the server did not shut down cleanly:\n' + s.stderr());
  }
});

test('a non-streaming request whose client disconnects is cancelled, its slot and pages freed', async () => {
  const s = await h.startServer(['-m', MODEL, '--threads', '1', '--parallel', '2', '--ctx', '4096']);
  try {
    // Two requests that would run for the whole context; their clients leave.
    const body = JSON.stringify({ prompt: 'x', max_tokens: -1, ignore_eos: true });
    const { hostname, port } = new URL(s.url);
    const socks = [0, 1].map(() => {
      const c = net.connect(Number(port), hostname);
      c.on('error', () => {});
      c.write(request('POST', '/v1/completions', [], body));
      return c;
    });
    assert.ok(await h.waitFor(async () => await h.metric(s.url, 'tessera_requests_running') === 2, 5000),
              'the requests did not start');
    const t0 = Date.now();
    for (const c of socks) c.destroy();
    assert.ok(await h.waitFor(async () => await h.metric(s.url, 'tessera_requests_running') === 0, 3000),
              'the abandoned requests kept running');
    assert.ok(Date.now() - t0 < 2000, `cancelled after ${Date.now() - t0} ms`);
    assert.equal(await h.metric(s.url, 'tessera_kv_pages_used'), 0);
    assert.equal(await h.metric(s.url, 'tessera_requests_cancelled_total'), 2);
  } finally {
    const code = await s.stop();
    assert.equal(code, 0, 'the server did not shut down cleanly:\n' + s.stderr());
  }
});

// Reads an SSE stream to its end; resolves to the data events' payloads.
async function readStream(res) {
  const dec = new TextDecoder();
  let text = '';
  try {
    for await (const part of res.body) text += dec.decode(part, { stream: true });
  } catch (e) { /* a cut stream shows as a missing [DONE] */ }
  return text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
}

test('SIGTERM during 8 streams: each ends with a final chunk and [DONE], exit 0 within --shutdown-timeout', async () => {
  const s = await h.startServer(['-m', MODEL, '--threads', '1', '--parallel', '8', '--ctx', '2048',
                                 '--shutdown-timeout', '3']);
  const body = { prompt: 'x', max_tokens: -1, ignore_eos: true, stream: true };
  const streams = await Promise.all(Array.from({ length: 8 }, () => fetch(s.url + '/v1/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })));
  for (const r of streams) assert.equal(r.status, 200);
  const events = streams.map(readStream);
  assert.ok(await h.waitFor(async () => await h.metric(s.url, 'tessera_requests_running') === 8, 5000));
  const t0 = Date.now();
  s.proc.removeAllListeners('exit');
  const exited = new Promise((res) => s.proc.once('exit', (code, signal) => res(signal ? `signal ${signal}` : code)));
  s.proc.kill('SIGTERM');
  // Draining: /health says so, and a new request is refused.
  await new Promise((r) => setTimeout(r, 300));
  const health = await fetch(s.url + '/health');
  assert.equal(health.status, 503);
  assert.deepEqual(await health.json(), { status: 'draining' });
  const late = await h.postJson(s.url + '/v1/completions', { prompt: 'x', max_tokens: 2 });
  assert.equal(late.status, 503);
  assert.equal(late.json.error.code, 'shutting_down');
  const code = await exited;
  const took = Date.now() - t0;
  assert.equal(code, 0, 'exit: ' + code + '\n' + s.stderr());
  assert.ok(took <= 3500, `exited ${took} ms after SIGTERM (--shutdown-timeout 3)`);
  assert.match(s.stderr(), /ending 8 running requests/);  // they were cut, not finished
  for (const ev of await Promise.all(events)) {
    assert.equal(ev[ev.length - 1], '[DONE]', 'a stream did not end with [DONE]: ' + ev.slice(-2));
    const last = JSON.parse(ev[ev.length - 2]);
    assert.equal(last.choices[0].finish_reason, 'length');
  }
});
