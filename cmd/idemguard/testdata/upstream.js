// An HTTP service that knows nothing of idempotency (Node, no packages).
//
// Every POST appends one line to a file: that line is its side effect, and
// the file is what a test counts. GET /healthz answers "ok".
//
//     node upstream.js --port PORT --file FILE [--delay-ms N]
//
// --delay-ms waits between appending the line and answering, so a process
// killed meanwhile has acted without answering.
'use strict';
const http = require('http');
const fs = require('fs');

const args = {};
for (let i = 2; i < process.argv.length; i += 2) {
  args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
}
if (!args.port || !args.file) {
  console.error('usage: node upstream.js --port PORT --file FILE [--delay-ms N]');
  process.exit(2);
}
const delay = Number(args['delay-ms'] || 0);
const fd = fs.openSync(args.file, 'a');
let lines = fs.readFileSync(args.file, 'utf8').split('\n').filter((l) => l !== '').length;

function answer(res, status, body, type = 'application/json') {
  res.writeHead(status, { 'Content-Type': type, 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/healthz') {
    answer(res, 200, 'ok\n', 'text/plain');
    return;
  }
  if (req.method !== 'POST') {
    answer(res, 405, '{"error":"method not allowed"}');
    return;
  }
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    let order;
    try {
      order = String(JSON.parse(Buffer.concat(chunks).toString() || '{}').order ?? '');
    } catch (e) {
      answer(res, 400, '{"error":"want a JSON object"}');
      return;
    }
    const entry = { order, key: req.headers['idempotency-key'] || '', server: 'node', pid: process.pid };
    fs.writeSync(fd, JSON.stringify(entry) + '\n'); // synchronous: the line is written before anything else runs
    const line = ++lines;
    const reply = () => answer(res, 201, JSON.stringify({ order, line, server: 'node' }));
    if (delay > 0) setTimeout(reply, delay); else reply();
  });
});
server.listen(Number(args.port), '127.0.0.1', () => console.log('ready'));
