// Starting `tessera serve` for a test and talking to it over HTTP.
'use strict';
const { spawn } = require('node:child_process');
const path = require('node:path');
const fs = require('node:fs');
const os = require('node:os');

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

// With TESSERA_RANKS=N (and TESSERA_MPIRUN), the servers a test starts are distributed
// runs of N ranks on this machine (docs/distributed.md); stop() then sends SIGTERM to
// rank 0, which ends every rank.
const RANKS = Number(process.env.TESSERA_RANKS || 1);

function spawnServer(args) {
  if (RANKS <= 1) return spawn(BIN, ['serve', '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  return spawn(process.env.TESSERA_MPIRUN, ['-np', String(RANKS), '--oversubscribe', '--bind-to', 'none', BIN, 'serve',
                                            '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: mpiEnv() });
}

// The environment of an mpirun on this machine: root allowed (containers), shared
// memory without the ptrace-based single copy (which containers forbid), and Open MPI's
// session directory under one of this run's own: concurrent launches (ctest -j)
// otherwise race to create the shared /tmp/ompi.HOST.UID and one fails at start.
function mpiEnv() {
  const base = fs.mkdtempSync(path.join(os.tmpdir(), 'tessera_ompi_'));
  process.on('exit', () => { try { fs.rmdirSync(base); } catch { /* not empty: left for a look */ } });
  return { ...process.env, OMPI_ALLOW_RUN_AS_ROOT: '1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: '1',
           OMPI_MCA_btl_vader_single_copy_mechanism: 'none', OMPI_MCA_orte_tmpdir_base: base };
}

// The process that takes a shutdown signal: the server, or rank 0 under mpirun (the
// tessera child of mpirun whose environment names rank 0).
function signalTarget(proc) {
  if (RANKS <= 1) return proc.pid;
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid !== proc.pid) continue;
      if (fs.readFileSync(`/proc/${name}/environ`, 'utf8').split('\0').includes('OMPI_COMM_WORLD_RANK=0'))
        return Number(name);
    } catch (e) { /* gone, or not ours */ }
  }
  return proc.pid;
}

// Starts the server on a free port; resolves to {url, proc, stop()} once it prints
// "listening on".
function startServer(args, timeoutMs = 60000) {
  return new Promise((resolve, reject) => {
    const proc = spawnServer(args);
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
            process.kill(signalTarget(proc), 'SIGTERM');
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

module.exports = { missing, startServer, signalTarget, mpiEnv, RANKS, postJson, metric, waitFor, FIXTURES, NODE_MODULES };
