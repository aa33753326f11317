// Drives `hyla serve`'s /v1/responses with the official `openai` npm package's Responses client
// (run by tests/test_serve.cpp): the SDK parses responses and accumulates event streams itself.
//   node responses_client.cjs BASE_URL MODEL SCENARIO.json
// Exits non-zero with a message on the first failed check.
const fs = require("fs");
const assert = require("assert");
const OpenAI = require("openai");

const [baseURL, model, scenarioPath] = process.argv.slice(2);
const scenario = JSON.parse(fs.readFileSync(scenarioPath, "utf8"));
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });

const tools = scenario.tools.map((t) => ({ type: "function", ...t.function }));
const hello = scenario.hello_messages[0].content;
const weather = scenario.weather_messages[0].content;
const callOf = (response) => response.output.find((item) => item.type === "function_call");

async function main() {
  const plain = await client.responses.create({ model, input: hello, temperature: 0 });
  assert.strictEqual(plain.object, "response");
  assert.strictEqual(plain.status, "completed");
  assert.strictEqual(plain.output_text, scenario.hello_reply);
  assert.ok(plain.usage.input_tokens > 0 && plain.usage.output_tokens > 0);
  const items = await client.responses.create({
    model, temperature: 0, input: [{ role: "user", content: [{ type: "input_text", text: hello }] }],
  });
  assert.strictEqual(items.output_text, scenario.hello_reply);

  for (const c of scenario.image_cases) {
    const seen = await client.responses.create({
      model, temperature: 0, max_output_tokens: 16,
      input: [{ role: "user", content: [{ type: "input_text", text: c.messages[0].content[0].text },
                                        { type: "input_image", image_url: c.messages[0].content[1].image_url.url }] }],
    });
    assert.strictEqual(seen.output_text, c.reply);
  }

  const cut = await client.responses.create({ model, input: hello, temperature: 0, max_output_tokens: 2 });
  assert.strictEqual(cut.status, "incomplete");
  assert.strictEqual(cut.incomplete_details.reason, "max_output_tokens");

  // A call, then the tool loop twice: continued by previous_response_id, and with the whole history.
  const call = await client.responses.create({ model, input: weather, tools, temperature: 0 });
  const fc = callOf(call);
  assert.ok(fc && fc.name === "get_weather", JSON.stringify(call.output));
  assert.deepStrictEqual(JSON.parse(fc.arguments), { city: "Paris" });
  const continued = await client.responses.create({
    model, previous_response_id: call.id, tools, temperature: 0, max_output_tokens: 8,
    input: [{ type: "function_call_output", call_id: fc.call_id, output: "18 C and sunny" }],
  });
  const whole = await client.responses.create({
    model, tools, temperature: 0, max_output_tokens: 8,
    input: [{ role: "user", content: weather }, ...call.output,
            { type: "function_call_output", call_id: fc.call_id, output: "18 C and sunny" }],
  });
  assert.ok(["completed", "incomplete"].includes(continued.status));
  assert.deepStrictEqual(continued.output.map((o) => o.type), whole.output.map((o) => o.type));
  assert.strictEqual(continued.output_text, whole.output_text);  // the same prompt, greedy: the same reply

  // A forced call where the model would answer in text: well-formed by grammar.
  const forced = await client.responses.create({
    model, input: hello, tools, temperature: 1, tool_choice: { type: "function", name: "get_weather" },
  });
  assert.strictEqual(typeof JSON.parse(callOf(forced).arguments).city, "string");

  // Streams: the SDK accumulates the events into the same response.
  const stream = client.responses.stream({ model, input: hello, temperature: 0 });
  const types = [];
  let deltas = "";
  stream.on("event", (event) => types.push(event.type));
  stream.on("response.output_text.delta", (event) => { deltas += event.delta; });
  const final = await stream.finalResponse();
  assert.strictEqual(deltas, scenario.hello_reply);
  assert.strictEqual(final.output_text, scenario.hello_reply);
  assert.strictEqual(types[0], "response.created");
  assert.strictEqual(types[types.length - 1], "response.completed");
  const toolStream = client.responses.stream({ model, input: weather, tools, temperature: 0 });
  const toolTypes = [];
  toolStream.on("event", (event) => toolTypes.push(event.type));
  const toolFinal = await toolStream.finalResponse();
  assert.deepStrictEqual(JSON.parse(callOf(toolFinal).arguments), { city: "Paris" });
  assert.ok(toolTypes.includes("response.function_call_arguments.delta"), toolTypes.join(","));
  // A stored stream is continued like any response.
  const streamedContinuation = await client.responses.create({
    model, previous_response_id: toolFinal.id, tools, temperature: 0, max_output_tokens: 8,
    input: [{ type: "function_call_output", call_id: callOf(toolFinal).call_id, output: "18 C and sunny" }],
  });
  assert.strictEqual(streamedContinuation.output_text, whole.output_text);

  const bad = async (request, pattern) =>
    assert.rejects(client.responses.create({ model, ...request }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.ok(pattern.test(e.message), e.message);
      return true;
    });
  await bad({ input: [{ type: "function_call_output", call_id: "call_none", output: "x" }] }, /no function call/);
  await bad({ input: hello, previous_response_id: "resp_none" }, /not found/);
  await bad({ input: hello, tools: [{ type: "web_search" }] }, /hosted tools/);
  await bad({ input: [{ type: "item_reference", id: "x" }] }, /'item_reference' item/);
  console.log("responses client: all checks passed");
}

main().catch((e) => {
  console.error("responses client: FAILED:", e);
  process.exit(1);
});
