// run.js — runs an ONNX model under ONNX Runtime (the onnxruntime-web
// package: its WebAssembly backend, one thread, nothing native) for kiln's
// export tests. Usage:
//   node run.js MODEL.onnx INPUT.f32 D0,D1,... OUTPUT.f32
// INPUT.f32 holds the model input's float32 values (little-endian) of shape
// D0,D1,...; the first output's values are written to OUTPUT.f32, and one
// JSON line on stdout names the input, the output and the output's dims.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-web');

async function main() {
  const [model, inputPath, dimsText, outputPath] = process.argv.slice(2);
  if (!outputPath) {
    console.error('usage: node run.js MODEL.onnx INPUT.f32 D0,D1,... OUTPUT.f32');
    process.exit(2);
  }
  ort.env.wasm.numThreads = 1;
  const session = await ort.InferenceSession.create(fs.readFileSync(model), {
    executionProviders: ['wasm'],
  });
  const dims = dimsText.split(',').map(Number);
  const raw = fs.readFileSync(inputPath);
  const data = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length));
  const feeds = {[session.inputNames[0]]: new ort.Tensor('float32', data, dims)};
  const results = await session.run(feeds);
  const out = results[session.outputNames[0]];
  fs.writeFileSync(outputPath, Buffer.from(out.data.buffer, out.data.byteOffset, out.data.byteLength));
  console.log(JSON.stringify({input: session.inputNames[0], output: session.outputNames[0], dims: out.dims}));
}

main().catch((e) => {
  console.error(`run.js: ${e && e.message ? e.message : e}`);
  process.exit(1);
});
