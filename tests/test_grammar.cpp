// GBNF grammars (parser, matcher, vocabulary masking) and the JSON-schema converter.
#include <doctest/doctest.h>

#include <random>
#include <string>

#include "../llm.hpp"

namespace {

bool matches(const std::string& gbnf, const std::string& text) { return llm::Grammar(gbnf).matches(text); }

std::string error_of(const std::string& gbnf) {
    try {
        llm::Grammar g(gbnf);
        g.matches("");
    } catch (const llm::Error& e) {
        return e.what();
    }
    return "";
}

const llm::Vocab& vocab() {
    static auto gguf = llm::GGUF::open("models/SmolLM2-135M-Instruct-Q4_1.gguf");
    static llm::Vocab v(*gguf);
    return v;
}

// Samples under the grammar from random logits (which favour arbitrary tokens, so the masking path
// runs) until an end-of-generation token or max_tokens; returns the text.
std::string generate(const std::string& gbnf, uint64_t seed, int max_tokens, bool* finished = nullptr) {
    const llm::Vocab& v = vocab();
    llm::SamplerParams p;
    p.grammar = gbnf;
    p.seed = seed;
    p.temperature = 1.0f;
    llm::Sampler s(p, &v);
    std::mt19937 rng((uint32_t)seed);
    std::normal_distribution<float> nd(0, 4);
    std::vector<float> logits(v.n_tokens());
    std::string text;
    for (int i = 0; i < max_tokens; i++) {
        for (float& x : logits) x = nd(rng);
        for (int32_t e : v.eog_ids()) logits[e] = 2.0f;  // make ending likely once allowed
        const int32_t t = s.sample(logits.data(), (int)logits.size());
        if (v.is_eog(t)) {
            if (finished) *finished = true;
            return text;
        }
        s.accept(t);
        text += v.token_to_piece(t);
    }
    if (finished) *finished = false;
    return text;
}

}  // namespace

TEST_CASE("grammar: literals, classes, groups, alternatives and repetitions") {
    const std::string g = R"(
        # a comment
        root ::= "a" [b-d]+ ("x" | "y"){2} tail?
        tail ::= "!" |
          "?" # continued after |
    )";
    CHECK(matches(g, "abx y") == false);
    CHECK(matches(g, "abxy"));
    CHECK(matches(g, "acdcbyy!"));
    CHECK(matches(g, "abyx?"));
    CHECK_FALSE(matches(g, "axy"));     // + needs one
    CHECK_FALSE(matches(g, "abx"));     // {2} needs two
    CHECK_FALSE(matches(g, "abxyx"));
    CHECK_FALSE(matches(g, "abxy!!"));
    CHECK(matches(R"(root ::= [^a-c\n] . "\x41\u00e9\"\\" )", "z\xc3\xa9" "A\xc3\xa9\"\\"));
    CHECK_FALSE(matches(R"(root ::= [^a-c\n] . "x")", "b.x"));
    CHECK(matches(R"(root ::= "a"{2,3} "b"{0,} "c"{1,})", "aabbbc"));
    CHECK_FALSE(matches(R"(root ::= "a"{2,3})", "aaaa"));
    CHECK(matches(R"(root ::= [α-ω]+ "😀")", "αβγ😀"));
    CHECK_FALSE(matches(R"(root ::= [α-ω]+)", "αbγ"));
    CHECK(matches("root ::= (\n  \"a\"\n  | \"b\"\n)*\n", "abba"));
    CHECK(matches(R"g(root ::= x* | "q"
x ::= "(" x* ")")g", "(()(()))"));
    CHECK(matches(R"(root ::= "")", ""));
}

TEST_CASE("grammar: bad or hostile grammars are errors naming the problem") {
    CHECK(error_of("root ::= foo").find("undefined rule 'foo'") != std::string::npos);
    CHECK(error_of("start ::= \"a\"").find("no 'root' rule") != std::string::npos);
    CHECK(error_of("root ::= root \"a\" | \"b\"").find("left recursion") != std::string::npos);
    CHECK(error_of("root ::= x \"a\"\nx ::= \"\" | root").find("left recursion") != std::string::npos);
    CHECK(error_of("root ::= \"abc").find("unterminated") != std::string::npos);
    CHECK(error_of("root ::= [abc").find("unterminated") != std::string::npos);
    CHECK(error_of("root ::= \"a\"{3,2}").find("n < m") != std::string::npos);
    CHECK(error_of("root ::= \"a\"{0,100000}").find("repetition count") != std::string::npos);
    CHECK(error_of("root ::= * \"a\"").find("nothing before") != std::string::npos);
    CHECK(error_of("root ::= \"\\q\"").find("unknown escape") != std::string::npos);
    CHECK(error_of("root := \"a\"").find("'::='") != std::string::npos);
    CHECK(error_of("root ::= \"a\"\n\nroot2 ::= )").find("line 3") != std::string::npos);
    CHECK(error_of(std::string(300, '(') + "root ::= \"a\"").size() > 0);
    CHECK(error_of("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')')).find("nested deeper") != std::string::npos);
    // Many nested repetitions: too many rules or elements, refused at parse time.
    CHECK(error_of("root ::= ((((\"a\"{0,9999}){0,9999}){0,9999}){0,9999})").find("more than 20000 rules") != std::string::npos);
    // An optional item repeated 9999 times has 9999 ways to skip ahead: too many parse states.
    CHECK(error_of("root ::= (\"a\"?){9999}").find("too many parse states") != std::string::npos);
}

TEST_CASE("grammar: sampling masks the vocabulary, across tokens and partial UTF-8") {
    const std::string yes_no = "root ::= (\"yes\" | \"no\") \"!\"";
    for (uint64_t seed = 1; seed <= 3; seed++) {
        bool done = false;
        const std::string text = generate(yes_no, seed, 50, &done);
        CHECK(done);
        CHECK((text == "yes!" || text == "no!"));
    }
    // Multi-byte characters come out as byte tokens or merged ones; either way the text is exact.
    const std::string uni = "root ::= \"é€😀\" [α-ω]{3}";
    for (uint64_t seed = 1; seed <= 3; seed++) {
        bool done = false;
        const std::string text = generate(uni, seed, 60, &done);
        CHECK(done);
        CHECK(llm::Grammar(uni).matches(text));
    }
    const std::string list = R"(root ::= "[" num ("," num){0,3} "]"
num ::= [1-9] [0-9]{0,2})";
    bool done = false;
    const std::string text = generate(list, 5, 80, &done);
    CHECK(done);
    CHECK(llm::Grammar(list).matches(text));
    CHECK(text.front() == '[');
}

TEST_CASE("grammar: the sampler's grammar state follows accepted tokens; prompt tokens do not count") {
    const llm::Vocab& v = vocab();
    llm::SamplerParams p;
    p.grammar = "root ::= \"ok\"";
    p.temperature = 0;
    llm::Sampler s(p, &v);
    for (int32_t t : v.tokenize("any prompt text", false, false)) s.accept(t, false);
    CHECK_FALSE(s.grammar_accepts_eog());
    for (int32_t t : v.tokenize("ok", false, false)) s.accept(t);
    CHECK(s.grammar_accepts_eog());
    CHECK_THROWS_AS(s.accept(v.tokenize("x", false, false).at(0)), llm::Error);
    CHECK_THROWS_AS(llm::Sampler(p, nullptr), llm::Error);  // a grammar needs the vocabulary
    p.grammar = "root ::= undefined";
    CHECK_THROWS_AS(llm::Sampler(p, &v), llm::Error);
}

TEST_CASE("grammar: a lazy grammar leaves the text free until a trigger word, then constrains from that word on") {
    const llm::Vocab& v = vocab();
    llm::SamplerParams p;
    p.grammar = "root ::= \"<call>\" [0-9]{2} \"</call>\"";
    p.grammar_lazy = true;
    p.grammar_triggers = {"<call>"};
    p.temperature = 0;
    llm::Sampler s(p, &v);
    auto accept_text = [&](const std::string& text) { for (int32_t t : v.tokenize(text, false, false)) s.accept(t); };
    // Waiting: any text, any token, and the end are allowed.
    std::vector<float> logits(v.n_tokens(), 0.0f);
    const int32_t free_token = v.tokenize(" hello", false, false).at(0);
    logits[free_token] = 10.0f;
    CHECK(s.sample(logits.data(), (int)logits.size()) == free_token);
    accept_text("Let me look it up: <ca");  // a trigger's prefix does not start it
    CHECK(s.grammar_accepts_eog());
    CHECK(s.sample(logits.data(), (int)logits.size()) == free_token);
    // The word, split across tokens and followed by a digit in the same piece: the grammar has started there.
    accept_text("ll>4");
    CHECK_FALSE(s.grammar_accepts_eog());
    const int32_t digit = s.sample(logits.data(), (int)logits.size());  // the masked chain: a digit, not " hello"
    const std::string piece = v.token_to_piece(digit);
    CHECK((piece.size() == 1 && piece[0] >= '0' && piece[0] <= '9'));
    s.accept(digit);
    accept_text("</call>");
    CHECK(s.grammar_accepts_eog());
    // reset() waits again.
    s.reset();
    accept_text("write then ");
    CHECK(s.grammar_accepts_eog());
    accept_text("<call>12");
    CHECK_FALSE(s.grammar_accepts_eog());
    CHECK_THROWS_AS(s.accept(free_token), llm::Error);  // constrained now
    // Random logits: free text before the word, exact grammar text after it.
    llm::Sampler r(p, &v);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0, 4);
    std::string text;
    for (int32_t t : v.tokenize("ok <call>", false, false)) {
        r.accept(t);
        text += v.token_to_piece(t);
    }
    bool ended = false;
    for (int i = 0; i < 40 && !ended; i++) {
        for (float& x : logits) x = nd(rng);
        const int32_t t = r.sample(logits.data(), (int)logits.size());
        ended = v.is_eog(t);
        if (!ended) text += v.token_to_piece(t);
        r.accept(t);
    }
    CHECK(ended);
    REQUIRE(text.rfind("ok ", 0) == 0);
    CHECK(llm::Grammar(p.grammar).matches(text.substr(3)));
}

TEST_CASE("json_schema: the grammar accepts exactly the documents the schema describes") {
    auto accepts = [](const std::string& schema, const std::string& doc) {
        return llm::Grammar(llm::json_schema_to_grammar(schema)).matches(doc);
    };
    const std::string person = R"({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
            "kind": {"enum": ["a", "b", 3]},
            "ok": {"type": "boolean"},
            "score": {"type": ["number", "null"]}
        },
        "required": ["name", "age"]
    })";
    CHECK(accepts(person, R"({"name": "Bo", "age": 42})"));
    CHECK(accepts(person, R"({"name":"Bo","age":-7,"tags":["x"],"kind":3,"ok":true,"score":1.5e3})"));
    CHECK(accepts(person, "{\n  \"name\": \"Bo\",\n  \"age\": 0,\n  \"score\": null\n}"));
    CHECK(accepts(person, R"({"name": "Bo", "age": 1, "ok": false})"));  // optional ones may be skipped
    CHECK_FALSE(accepts(person, R"({"age": 42})"));                         // required
    CHECK_FALSE(accepts(person, R"({"name": "", "age": 42})"));             // minLength
    CHECK_FALSE(accepts(person, R"({"name": "123456789", "age": 42})"));    // maxLength
    CHECK_FALSE(accepts(person, R"({"name": "Bo", "age": 4.5})"));          // integer
    CHECK_FALSE(accepts(person, R"({"name": "Bo", "age": 1, "tags": []})"));          // minItems
    CHECK_FALSE(accepts(person, R"({"name": "Bo", "age": 1, "tags": ["a","b","c"]})"));  // maxItems
    CHECK_FALSE(accepts(person, R"({"name": "Bo", "age": 1, "kind": "c"})"));  // enum
    CHECK_FALSE(accepts(person, R"({"name": "Bo", "age": 1, "extra": 1})"));   // no additionalProperties
    CHECK_FALSE(accepts(person, R"({"name": "Bo", "age": 1, "ok": true, "tags": ["x"]})"));  // property order

    const std::string defs = R"({
        "$defs": {"node": {"type": "object", "properties": {"v": {"const": "x"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
        "$ref": "#/$defs/node"
    })";
    CHECK(accepts(defs, R"({"v": "x", "next": {"v": "x", "next": null}})"));
    CHECK_FALSE(accepts(defs, R"({"v": "y", "next": null})"));
    const std::string formats = R"({"type": "array", "prefixItems": [{"type": "string", "format": "date"}, {"type": "string", "format": "uuid"}, {"type": "string", "format": "date-time"}]})";
    CHECK(accepts(formats, R"(["2024-02-29", "123e4567-e89b-12d3-a456-426614174000", "2024-01-01T10:20:30Z"])"));
    CHECK_FALSE(accepts(formats, R"(["2024-13-01", "123e4567-e89b-12d3-a456-426614174000", "2024-01-01T10:20:30Z"])"));
    const std::string all_of = R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"properties": {"b": {"type": "null"}}}]})";
    CHECK(accepts(all_of, R"({"a": 1, "b": null})"));
    CHECK(accepts(all_of, R"({"a": 1})"));
    CHECK_FALSE(accepts(all_of, R"({"b": null})"));
    const std::string open = R"({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true})";
    CHECK(accepts(open, R"({"a": 1, "zz": [1, {"q": "r"}]})"));
    CHECK(accepts("{}", R"([1, "two", {"three": null}])"));
    CHECK(accepts(R"({"type": "object"})", R"({"k": [true]})"));
    CHECK(accepts(R"({"type": "string"})", R"("esc \" \\ \u00e9 é")"));
    CHECK_FALSE(accepts(R"({"type": "string"})", "\"raw \n newline\""));
}

TEST_CASE("json_schema: invalid schemas are errors with a clear message") {
    auto error = [](const std::string& schema) {
        try {
            llm::json_schema_to_grammar(schema);
        } catch (const llm::Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK(error("{\"type\": ").find("invalid JSON") != std::string::npos);
    CHECK(error(R"({"type": "strin"})").find("unsupported type 'strin'") != std::string::npos);
    CHECK(error(R"({"$ref": "#/$defs/missing"})").find("unresolved $ref") != std::string::npos);
    CHECK(error(R"({"type": "array", "minItems": 3, "maxItems": 1})").find("maxItems") != std::string::npos);
    CHECK(error(R"({"type": "string", "pattern": "^a+$"})").find("pattern") != std::string::npos);
    CHECK(error("[1, 2]").find("must be an object") != std::string::npos);
    CHECK(error(std::string(100, '[') + std::string(100, ']')).find("deeper than 64") != std::string::npos);
    CHECK(error("").find("json_schema:") == 0);
}
