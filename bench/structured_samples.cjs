// Structured output on a random model: N seeded samples per schema (and per GBNF
// grammar) at temperature 1, each validated with ajv, counting the samples that end
// by themselves, those cut at max_tokens, and any invalid one. A random model's
// unconstrained output is noise, so what comes out is the grammar's doing.
//
//   node bench/structured_samples.cjs URL [N=1000] [CLIENTS=8] [MAX_TOKENS=1000]
//   (SCHEMAS=name,name,... runs only those cases; gbnf_arithmetic names the grammar)
//
// URL is a running `tessera serve` (e.g. on ../shared/fixtures/models/llama-q8_0.gguf);
// ajv comes from TESSERA_NODE_MODULES (scripts/setup.sh installs it under build/node).
'use strict';
const path = require('node:path');

const [url, nArg, clientsArg, maxArg] = process.argv.slice(2);
if (!url) {
  console.error('usage: node bench/structured_samples.cjs URL [N] [CLIENTS] [MAX_TOKENS]');
  process.exit(2);
}
const N = Number(nArg || 1000), CLIENTS = Number(clientsArg || 8), MAX_TOKENS = Number(maxArg || 1000);
const modules = process.env.TESSERA_NODE_MODULES || path.join(__dirname, '..', 'build', 'node', 'node_modules');
const Ajv = require(path.join(modules, 'ajv'));
const ajv = new Ajv({ strict: false });

const schemas = {
  nested_objects: {
    type: 'object',
    properties: {
      user: { type: 'object', properties: {
        name: { type: 'string', minLength: 1, maxLength: 12 },
        age: { type: 'integer', minimum: 0, maximum: 120 },
        address: { type: 'object', properties: { city: { type: 'string', maxLength: 16 },
                                                  zip: { type: 'string', pattern: '^[0-9]{5}$' } },
                   required: ['city', 'zip'], additionalProperties: false } },
        required: ['name', 'age', 'address'], additionalProperties: false },
      active: { type: 'boolean' },
    },
    required: ['user', 'active'], additionalProperties: false,
  },
  array_of_enums: { type: 'array', items: { enum: ['red', 'green', 'blue', 'cyan'] }, minItems: 1, maxItems: 8 },
  recursive_tree: {
    $defs: { node: { type: 'object', properties: {
      value: { type: 'integer', minimum: 0, maximum: 99 },
      children: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } },
      required: ['value'], additionalProperties: false } },
    $ref: '#/$defs/node',
  },
  any_of: { anyOf: [
    { type: 'integer', minimum: 0, maximum: 1000 },
    { type: 'string', maxLength: 10 },
    { type: 'object', properties: { ok: { type: 'boolean' }, code: { enum: [200, 404] } }, required: ['ok'],
      additionalProperties: false },
  ] },
  tool_parameters: {
    type: 'object',
    properties: { city: { type: 'string', minLength: 1, maxLength: 20 },
                  days: { type: 'integer', minimum: 1, maximum: 14 },
                  unit: { enum: ['celsius', 'fahrenheit'] } },
    required: ['city', 'days'], additionalProperties: false,
  },
};

// Integer arithmetic: validated by parsing it back.
const ARITHMETIC = `root ::= expr
expr ::= term (ws [-+] ws term){0,4}
term ::= factor (ws [*/] ws factor){0,3}
factor ::= [1-9] [0-9]{0,3} | "(" ws expr ws ")"
ws ::= " "?
`;
function isArithmetic(s) {
  let i = 0;
  const sp = () => { if (s[i] === ' ') i++; };
  const factor = (depth) => {
    if (s[i] === '(') { i++; sp(); if (!expr(depth + 1)) return false; sp(); return s[i++] === ')'; }
    const m = /^[1-9][0-9]{0,3}/.exec(s.slice(i));
    if (!m) return false;
    i += m[0].length;
    return true;
  };
  const term = (d) => { if (!factor(d)) return false; for (let k = 0; k < 3; k++) { const j = i; sp(); if ('*/'.includes(s[i]) && s[i]) { i++; sp(); if (!factor(d)) return false; } else { i = j; break; } } return true; };
  const expr = (d) => { if (!term(d)) return false; for (let k = 0; k < 4; k++) { const j = i; sp(); if ('+-'.includes(s[i]) && s[i]) { i++; sp(); if (!term(d)) return false; } else { i = j; break; } } return true; };
  return expr(0) && i === s.length;
}

async function sample(body) {
  const r = await fetch(url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
                                                   body: JSON.stringify(body) });
  const j = await r.json();
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${JSON.stringify(j)}`);
  return j.choices[0];
}

async function run(name, constraint, valid) {
  const counts = { samples: 0, ended: 0, max_tokens: 0, valid: 0, invalid: 0 };
  const invalid = [];
  let next = 1;
  const t0 = Date.now();
  await Promise.all(Array.from({ length: CLIENTS }, async () => {
    while (next <= N) {
      const seed = next++;
      const c = await sample({ prompt: 'Answer:', max_tokens: MAX_TOKENS, temperature: 1.0, seed, ...constraint });
      counts.samples++;
      if (c.finish_reason === 'length') { counts.max_tokens++; continue; }
      counts.ended++;
      if (valid(c.text)) counts.valid++;
      else { counts.invalid++; if (invalid.length < 3) invalid.push(c.text); }
    }
  }));
  counts.seconds = (Date.now() - t0) / 1000;
  console.log(JSON.stringify({ name, ...counts, max_tokens_pct: +(100 * counts.max_tokens / counts.samples).toFixed(2),
                               invalid_examples: invalid }));
  return counts;
}

(async () => {
  let bad = 0;
  for (const [name, schema] of Object.entries(schemas)) { if (process.env.SCHEMAS && !process.env.SCHEMAS.split(",").includes(name)) continue;
    const check = ajv.compile(schema);
    const c = await run(name, { response_format: { type: 'json_schema', json_schema: { name, strict: true, schema } } },
                        (text) => { try { return check(JSON.parse(text)); } catch { return false; } });
    bad += c.invalid;
  }
  const g = process.env.SCHEMAS && !process.env.SCHEMAS.split(",").includes("gbnf_arithmetic") ? { invalid: 0 } : await run("gbnf_arithmetic", { grammar: ARITHMETIC }, isArithmetic);
  bad += g.invalid;
  process.exit(bad ? 1 : 0);
})().catch((e) => { console.error(e); process.exit(2); });
