// Starting `tessera serve` for a test and talking to it over HTTP.
'use strict';
const { spawn } = require('node:child_process');
const path = require('node:path');
const fs = require('node:fs');

const BIN = process.env.TESSERA_BIN;            // build/bin/tessera
const FIXTURES = process.env.TESSERA_FIXTURES;  // ../shared/fixtures
const NODE_MODULES = process.env.TESSERA_NODE_MODULES;  // build/node/node_modules

// Why the tests cannot run here, or null. `pkg`: the npm package the test needs.
function missing(pkg = 'openai') {
  if (!BIN || !fs.existsSync(BIN)) return `tessera binary not found (${BIN})`;
  if (!FIXTURES || !fs.existsSync(path.join(FIXTURES, 'models'))) return `fixtures not found (${FIXTURES})`;
  if (!NODE_MODULES || !fs.existsSync(path.join(NODE_MODULES, pkg))) return `npm package ${pkg} not installed in ${NODE_MODULES} (scripts/setup.sh installs it)`;
  return null;
}

// Starts the server on a free port; resolves to {url, proc, stop()} once it prints
// "listening on".
function startServer(args, timeoutMs = 60000) {
  return new Promise((resolve, reject) => {
    const proc = spawn(BIN, ['serve', '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    const timer = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error('server did not start: ' + err)); }, timeoutMs);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) {
        clearTimeout(timer);
        resolve({
          url: m[1], proc,
          stderr: () => err,
          // Resolves to the exit code: 0 for a clean shutdown; a sanitizer report
          // (a leak, an error) makes it non-zero.
          stop: () => new Promise((res) => {
            proc.removeAllListeners('exit');
            proc.once('exit', (code, signal) => res(signal ? `signal ${signal}` : code));
            proc.kill('SIGTERM');
          }),
        });
      }
    });
    proc.stderr.on('data', (d) => { err += d; });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}): ${err}`)); });
  });
}

async function postJson(url, body, headers = {}) {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers },
                               body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch (e) { /* not JSON */ }
  return { status: r.status, json, text };
}

// A metric's value from /metrics.
async function metric(base, name, headers = {}) {
  const r = await fetch(base + '/metrics', { headers });
  const text = await r.text();
  const m = text.match(new RegExp('^' + name + ' (\\S+)$', 'm'));
  return m ? Number(m[1]) : NaN;
}

async function waitFor(fn, timeoutMs = 10000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await fn()) return true;
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}

module.exports = { missing, startServer, postJson, metric, waitFor, FIXTURES, NODE_MODULES };
