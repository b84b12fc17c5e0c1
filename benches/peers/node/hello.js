// Hello world on Node.js `http` (seed 002): one process, one event loop.
// Usage: node hello.js PORT BACKLOG
'use strict';
const http = require('http');

const [port, backlog] = process.argv.slice(2).map(Number);

http
  .createServer((_req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/plain' });
    res.end('Hello, world');
  })
  .listen({ host: '127.0.0.1', port, backlog }, () => {
    console.log(`node hello listening on 127.0.0.1:${port} (backlog ${backlog})`);
  });
