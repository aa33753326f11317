// Drives `hyla serve` with the official `openai` npm package (run by tests/test_serve.cpp):
//   node openai_client.cjs BASE_URL MODEL SCENARIO.json
// Exits non-zero with a message on the first failed check.
const fs = require("fs");
const assert = require("assert");
const OpenAI = require("openai");

const [baseURL, model, scenarioPath] = process.argv.slice(2);
const scenario = JSON.parse(fs.readFileSync(scenarioPath, "utf8"));
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });

async function main() {
  const models = await client.models.list();
  assert.ok(models.data.some((m) => m.id === model), "models.list names the served model");

  // Greedy, so that the count does not depend on whether a sampled end token came first.
  const completion = await client.completions.create({ model, prompt: "In the beginning", max_tokens: 5, temperature: 0 });
  assert.strictEqual(completion.object, "text_completion");
  assert.strictEqual(completion.choices.length, 1);
  assert.strictEqual(completion.choices[0].finish_reason, "length");
  assert.strictEqual(completion.usage.completion_tokens, 5);

  const hello = await client.chat.completions.create({ model, messages: scenario.hello_messages, temperature: 0 });
  assert.strictEqual(hello.choices[0].message.content, scenario.hello_reply);
  assert.strictEqual(hello.choices[0].finish_reason, "stop");
  assert.ok(hello.usage.total_tokens > 0, "chat usage");

  // Images as base64 PNG data URLs in content parts: each gets the reply the model memorised for it.
  for (const c of scenario.image_cases) {
    const seen = await client.chat.completions.create({ model, messages: c.messages, temperature: 0, max_tokens: 16 });
    assert.strictEqual(seen.choices[0].message.content, c.reply);
  }
  const remote = JSON.parse(JSON.stringify(scenario.image_cases[0].messages));
  remote[0].content[1].image_url.url = "https://example.com/cat.png";
  await assert.rejects(client.chat.completions.create({ model, messages: remote }), (e) => {
    assert.strictEqual(e.status, 400);
    assert.ok(/only data URLs/.test(e.message), e.message);
    return true;
  });

  const weather = await client.chat.completions.create({
    model, messages: scenario.weather_messages, tools: scenario.tools, temperature: 0,
  });
  const call = weather.choices[0].message.tool_calls[0];
  assert.strictEqual(weather.choices[0].finish_reason, "tool_calls");
  assert.strictEqual(call.function.name, "get_weather");
  assert.deepStrictEqual(JSON.parse(call.function.arguments), { city: "Paris" });

  // Constrained output: the memorised model knows no JSON, yet replies with an instance of the schema.
  const schema = {
    type: "object", additionalProperties: false, required: ["mood", "level"],
    properties: { mood: { enum: ["happy", "sad"] }, level: { type: "integer" }, note: { type: "string", maxLength: 8 } },
  };
  for (const seed of [1, 2, 3]) {
    const structured = await client.chat.completions.create({
      model, messages: scenario.hello_messages, temperature: 1, seed,
      response_format: { type: "json_schema", json_schema: { name: "mood", schema, strict: true } },
    });
    const reply = JSON.parse(structured.choices[0].message.content);
    assert.ok(["happy", "sad"].includes(reply.mood), `mood in the enum: ${structured.choices[0].message.content}`);
    assert.ok(Number.isInteger(reply.level), "level an integer");
    assert.ok(Object.keys(reply).every((k) => k in schema.properties), "no undeclared property");
    assert.strictEqual(structured.choices[0].finish_reason, "stop");
  }
  const object = await client.chat.completions.create({
    model, messages: scenario.hello_messages, temperature: 0, max_tokens: 200, response_format: { type: "json_object" },
  });
  if (object.choices[0].finish_reason === "stop") assert.ok(typeof JSON.parse(object.choices[0].message.content) === "object");
  else assert.ok(object.choices[0].message.content.startsWith("{"), "json_object output starts as an object");

  // A named tool_choice forces a well-formed call where the model would never make one.
  const moodTool = [{ type: "function", function: { name: "set_mood", parameters: schema } }];
  for (const stream of [false, true]) {
    const request = {
      model, messages: scenario.hello_messages, tools: moodTool, temperature: 1, seed: 7,
      tool_choice: { type: "function", function: { name: "set_mood" } },
    };
    const forced = stream ? await client.chat.completions.stream(request).finalChatCompletion()
                          : await client.chat.completions.create(request);
    const fc = forced.choices[0].message.tool_calls[0];
    assert.strictEqual(fc.function.name, "set_mood");
    assert.ok(["happy", "sad"].includes(JSON.parse(fc.function.arguments).mood), fc.function.arguments);
    assert.strictEqual(forced.choices[0].finish_reason, "tool_calls");
  }

  // logit_bias: +100 on one token makes greedy decoding repeat it; penalties are taken.
  const biased = await client.completions.create({
    model, prompt: "In the beginning", max_tokens: 3, temperature: 0, logit_bias: { [scenario.biased_token]: 100 },
  });
  assert.strictEqual(biased.choices[0].text, scenario.biased_text.repeat(3));
  const penalised = await client.completions.create({
    model, prompt: "In the beginning", max_tokens: 5, frequency_penalty: 1.5, presence_penalty: 0.5, seed: 1,
  });
  assert.strictEqual(penalised.choices.length, 1);

  // Streaming chat: the text deltas add up to the unstreamed reply.
  const stream = await client.chat.completions.create({
    model, messages: scenario.hello_messages, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "";
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length > 0 && chunk.choices[0].delta.content) text += chunk.choices[0].delta.content;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.strictEqual(text, scenario.hello_reply);
  assert.ok(usage && usage.completion_tokens === hello.usage.completion_tokens, "streamed usage");

  // Streaming tool calls, accumulated by the library's stream helper.
  const runner = client.chat.completions.stream({
    model, messages: scenario.weather_messages, tools: scenario.tools, temperature: 0,
  });
  const final = await runner.finalChatCompletion();
  assert.strictEqual(final.choices[0].message.tool_calls[0].function.name, "get_weather");
  assert.deepStrictEqual(JSON.parse(final.choices[0].message.tool_calls[0].function.arguments), { city: "Paris" });

  // Streaming completions. A fixed seed: sampled with a random one, end-of-text as the first token
  // left a single chunk once in a clean clone's CI run.
  const cstream = await client.completions.create({ model, prompt: "And it came", max_tokens: 4, stream: true, seed: 1 });
  let pieces = 0;
  for await (const chunk of cstream) pieces += chunk.choices.length;
  assert.ok(pieces >= 2, "completion stream chunks");

  // Errors arrive as the library's typed errors.
  await assert.rejects(
    client.completions.create({ model, prompt: "x", max_tokens: 100000 }),
    (e) => e instanceof OpenAI.BadRequestError && /max_tokens/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: "gpt-4o", messages: scenario.hello_messages }),
    (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(
    client.chat.completions.create({ model, messages: [{ role: "wizard", content: "hi" }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "messages[0].role");
  console.log("openai client: all checks passed");
}

main().catch((e) => {
  console.error("openai client: FAILED:", e && e.stack ? e.stack : e);
  process.exit(1);
});
