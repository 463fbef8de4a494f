// GBNF grammars (parser, matcher, vocabulary masking) and the JSON-schema converter.
#include <doctest/doctest.h>

#include <regex>
#include <random>
#include <string>

#include "../llm.hpp"
#include "server_util.hpp"

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

namespace {

// The token whose piece is exactly `piece`: the lazy-grammar tests build their text from chosen pieces.
int32_t token_of(const std::string& piece) {
    const llm::Vocab& v = vocab();
    for (int32_t id = 0; id < v.n_tokens(); id++)
        if (v.token_to_piece(id) == piece) return id;
    FAIL_CHECK("no token's piece is '" << piece << "'");
    return -1;
}

// Whether the sampler's next token is constrained: with the logits favouring " hello", it samples a
// token of the grammar instead (its piece returned).
std::string next_piece(llm::Sampler& s) {
    const llm::Vocab& v = vocab();
    std::vector<float> logits(v.n_tokens(), 0.0f);
    logits[token_of(" hello")] = 10.0f;
    return v.token_to_piece(s.sample(logits.data(), (int)logits.size()));
}

}  // namespace

TEST_CASE("grammar: a lazy grammar starts at the token that completes its trigger word, wherever the word lies in the pieces") {
    llm::SamplerParams p;
    p.grammar_lazy = true;
    p.temperature = 0;
    auto accept = [](llm::Sampler& s, std::initializer_list<const char*> pieces, bool generated = true) {
        for (const char* piece : pieces) s.accept(token_of(piece), generated);
    };
    auto is_digit = [](const std::string& piece) { return piece.size() == 1 && piece[0] >= '0' && piece[0] <= '9'; };
    {  // one piece holds the word twice: the first in passing ("[!" is no call), the second opens the call
        p.grammar = "root ::= \"[\" [0-9]+ \"]\"";
        p.grammar_triggers = {"["};
        llm::Sampler s(p, &vocab());
        accept(s, {"See", " "});
        CHECK(next_piece(s) == " hello");
        accept(s, {"[!["});
        CHECK_FALSE(s.grammar_accepts_eog());
        CHECK(is_digit(next_piece(s)));
        accept(s, {"4", "]"});
        CHECK(s.grammar_accepts_eog());
    }
    {  // a word split across pieces, after an occurrence in passing in the same piece ("<call><")
        p.grammar = "root ::= \"<call>\" [0-9]{2} \"</call>\"";
        p.grammar_triggers = {"<call>"};
        llm::Sampler s(p, &vocab());
        accept(s, {"<", "call", "><", "call"});
        CHECK(s.grammar_accepts_eog());
        CHECK(next_piece(s) == " hello");
        accept(s, {">"});
        CHECK_FALSE(s.grammar_accepts_eog());
        CHECK(is_digit(next_piece(s)));
    }
    {  // a word the prompt began (Functionary's ">>>") triggers when the generated text completes it;
       // a word wholly in the prompt ("{") does not
        p.grammar = "root ::= \">>>get_time\\n\"? \"{\" [0-9] \"}\"";
        p.grammar_triggers = {">>>get_time\n", "{"};
        llm::Sampler s(p, &vocab());
        accept(s, {"Question", "?", "\n", ">>>"}, false);
        const llm::Sampler::Snapshot before = s.snapshot();
        accept(s, {"get", "_", "time"});
        CHECK(s.grammar_accepts_eog());
        accept(s, {"\n"});
        CHECK_FALSE(s.grammar_accepts_eog());
        CHECK(next_piece(s).rfind("{", 0) == 0);
        s.restore(before);
        CHECK(s.grammar_accepts_eog());
        accept(s, {"get", "_", "time", "\n", "{"});
        CHECK(is_digit(next_piece(s)));
        llm::Sampler prompt_only(p, &vocab());
        accept(prompt_only, {">>>", "get", "_", "time", "\n", "{"}, false);
        accept(prompt_only, {"4"});
        CHECK(prompt_only.grammar_accepts_eog());
        CHECK(next_piece(prompt_only) == " hello");
    }
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
    CHECK(error(R"({"type": "string", "pattern": "^(?=a)$"})").find("pattern: lookaround") != std::string::npos);
    CHECK(error("[1, 2]").find("must be an object") != std::string::npos);
    CHECK(error(std::string(100, '[') + std::string(100, ']')).find("nested more than 64 deep") != std::string::npos);
    CHECK(error("").find("json_schema:") == 0);
}

namespace {

bool schema_accepts(const std::string& schema, const std::string& doc) {
    return llm::Grammar(llm::json_schema_to_grammar(schema)).matches(doc);
}

std::string schema_error(const std::string& schema) {
    try {
        llm::json_schema_to_grammar(schema);
    } catch (const llm::Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("json_schema: integer minimum/maximum accept exactly the integers in range") {
    struct Case { const char* bounds; long long lo, hi; };  // hi/lo beyond +-10^6: open
    const long long kOpen = 1000000;
    const Case cases[] = {
        {R"("minimum": 0, "maximum": 0)", 0, 0},           {R"("minimum": -5, "maximum": 123)", -5, 123},
        {R"("minimum": 1, "maximum": 9)", 1, 9},           {R"("minimum": 10, "maximum": 99)", 10, 99},
        {R"("minimum": 0, "maximum": 1000)", 0, 1000},     {R"("minimum": -1000, "maximum": -1)", -1000, -1},
        {R"("minimum": -999, "maximum": -100)", -999, -100}, {R"("minimum": 7, "maximum": 7)", 7, 7},
        {R"("minimum": -1, "maximum": 1)", -1, 1},         {R"("minimum": 13, "maximum": 987)", 13, 987},
        {R"("minimum": 100, "maximum": 199)", 100, 199},   {R"("minimum": 101, "maximum": 1099)", 101, 1099},
        {R"("minimum": -210, "maximum": 345)", -210, 345}, {R"("minimum": 0)", 0, kOpen},
        {R"("minimum": 1)", 1, kOpen},                     {R"("minimum": -12)", -12, kOpen},
        {R"("minimum": 250)", 250, kOpen},                 {R"("maximum": 0)", -kOpen, 0},
        {R"("maximum": -3)", -kOpen, -3},                  {R"("maximum": 77)", -kOpen, 77},
        {R"("maximum": -250)", -kOpen, -250},              {R"("exclusiveMinimum": 0)", 1, kOpen},
        {R"("exclusiveMaximum": 10)", -kOpen, 9},          {R"("minimum": 1.5, "maximum": 2.5)", 2, 2},
        {R"("exclusiveMinimum": 1.5, "exclusiveMaximum": 9.0)", 2, 8},
        {R"("minimum": 5, "exclusiveMinimum": true, "maximum": 9, "exclusiveMaximum": true)", 6, 8},  // draft 4
        {R"("minimum": 3, "exclusiveMinimum": 5, "maximum": 40, "exclusiveMaximum": 50)", 6, 40},   // the stricter
    };
    int checked = 0;
    for (const Case& c : cases) {
        const llm::Grammar g(llm::json_schema_to_grammar(std::string(R"({"type": "integer", )") + c.bounds + "}"));
        for (long long n = -1300; n <= 1300; n++) {
            const bool in = n >= c.lo && n <= c.hi;
            if (g.matches(std::to_string(n)) != in) FAIL_CHECK(c.bounds << ": " << n << (in ? " rejected" : " accepted"));
            checked++;
        }
        for (long long n : {-999999999999999LL, -54321LL, 54321LL, 12345678LL, 999999999999999LL}) {  // open ends reach 16 digits
            const bool in = (n >= c.lo || c.lo == -kOpen) && (n <= c.hi || c.hi == kOpen);
            CHECK_MESSAGE(g.matches(std::to_string(n)) == in, c.bounds, " ", n);
        }
        CHECK_FALSE(g.matches("-0"));
        CHECK_FALSE(g.matches("01"));
        CHECK_FALSE(g.matches("1.0"));
    }
    CHECK(checked == 27 * 2601);
    CHECK(schema_accepts(R"({"type": "integer", "minimum": 0})", "1234567890123456"));
    CHECK_FALSE(schema_accepts(R"({"type": "integer", "minimum": 0})", "12345678901234567"));  // 16 digits, as integral-part
    CHECK(schema_accepts(R"({"type": "integer", "minimum": 99999999999999999})", "99999999999999999"));
    CHECK(schema_accepts(R"({"type": "integer", "minimum": -900000000000000000, "maximum": 900000000000000000})", "-123"));
    CHECK(schema_accepts(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 12}}})", R"({"n": 12})"));
    CHECK_FALSE(schema_accepts(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 12}}})", R"({"n": 13})"));
    CHECK(schema_error(R"({"type": "integer", "minimum": 5, "maximum": 4})").find("no integer lies within") != std::string::npos);
    CHECK(schema_error(R"({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2})").find("no integer") != std::string::npos);
    CHECK(schema_error(R"({"type": "integer", "minimum": "5"})").find("'minimum' must be a number") != std::string::npos);
    CHECK(schema_error(R"({"type": "integer", "maximum": 1e30})").find("'maximum' is out of range") != std::string::npos);
}

namespace {

// Random strings over the characters of a pattern's alphabet, checked against std::regex's
// ECMAScript search (what JSON Schema validators do): the grammar must accept exactly those, written
// as JSON strings.
int compare_with_regex(const std::string& pattern, const std::string& alphabet, const std::vector<std::string>& examples,
                       uint32_t seed) {
    const llm::Grammar g(llm::json_schema_to_grammar(nlohmann::json{{"type", "string"}, {"pattern", pattern}}.dump()));
    const std::regex re(pattern, std::regex::ECMAScript);
    std::mt19937 rng(seed);
    std::vector<std::string> inputs = examples;
    for (int i = 0; i < 400; i++) {
        std::string s;
        for (int n = (int)(rng() % 8); n > 0; n--) s += alphabet[rng() % alphabet.size()];
        inputs.push_back(s);
    }
    int accepted = 0;
    for (const std::string& s : inputs) {
        const bool want = std::regex_search(s, re);
        const bool got = g.matches(nlohmann::json(s).dump());
        if (want != got) FAIL_CHECK("pattern " << pattern << " on " << nlohmann::json(s).dump() << ": regex " << want << ", grammar " << got);
        accepted += got;
    }
    return accepted;
}

}  // namespace

TEST_CASE("json_schema: string patterns accept what ECMAScript regexes match") {
    struct Case { const char* pattern; const char* alphabet; std::vector<std::string> examples; };
    const Case cases[] = {
        {R"(^[a-z]+\d{2,3}(-x|y)?$)", "ab19-xyZ", {"ab12", "z999-x", "q10y", "ab1", "ab1234", "Ab12"}},
        {R"(^\d{3}-\d{4}$)", "0129-a", {"555-1234", "55-1234", "555-12345"}},
        {R"(ab|^c)", "abcx", {"xxab", "cx", "xc"}},
        {R"(^(?:a|bc)*d?$)", "abcd", {"", "abcad", "abd", "bcbc", "b"}},
        {R"(^[^a-c]{1,3}$)", "abcxy\"\\\t", {"x", "xyz", "wxyz", "\"\\", "\t"}},
        {R"(x.y)", "xy\n\"\\.", {"x.y", "x\ny", "x\"y", "x\\y", "xxyy"}},
        {R"(^\w+@\w+\.com$)", "ab_@.comx", {"a_1@b.com", "a@b.co", "@b.com", "a@b_com"}},
        {R"(^\s*[+-]?\d+(\.\d+)?\s*$)", " \t+-12.5x", {" -12.5 ", "+3", "1.", ".5", "\t7\t"}},
        {R"(^a{2}b{1,}c{0,2}$)", "abc", {"aab", "aabbbcc", "aabccc", "ab"}},
        {R"(^[\]\-\\]+$)", "]-\\a", {"]", "-\\]", "a"}},
        {R"(^a"b\\c$)", "a\"b\\c", {"a\"b\\c", "a\"bc"}},
        {R"(^(a|b)?$)", "abc", {"", "a", "ab"}},
        {R"(^$)", "a", {"", "a"}},
        {R"(^.{3}$)", "ab\n", {"abc", "ab", "a\nb"}},
        {R"(^\D\W\S$)", "a1 -", {"a-1", "1a-", "a -"}},
        {R"(^a*?b+?$)", "ab", {"aabb", "b", "a"}},
        {R"(^x{2,}$)", "xy", {"xx", "xxxxx", "x"}},
        {R"(^\x41\u0042$)", "ABa", {"AB", "ab"}},
        {R"(^[a-]$|^[-b]$)", "ab-c", {"a", "-", "b", "c"}},
        {R"(^\.\*\+\?\(\)\[\]\{\}\|\^\$$)", ".*+?()", {".*+?()[]{}|^$"}},
        {R"(^\t\n\\$)", "\t\n\\a", {"\t\n\\", "\t\n"}},
        {R"(^(\d{4})-(0[1-9]|1[0-2])$)", "0129-", {"2024-01", "2024-13", "2024-00"}},
        {R"(^[\s\S]$)", "a \n\t", {"a", " ", "\n", "ab"}},
        {R"(^(ab|cd)+(e|)$)", "abcde", {"ab", "cdabe", "abe", "e"}},
    };
    int accepted = 0;
    uint32_t seed = 1;
    for (const Case& c : cases) accepted += compare_with_regex(c.pattern, c.alphabet, c.examples, seed++);
    CHECK(accepted > 300);  // the cases exercise acceptance, not only rejection
    // Characters beyond ASCII, '{' as a character, and a pattern without anchors (a search).
    const std::string uni = R"({"type": "string", "pattern": "^é+[α-ω]?😀$"})";
    CHECK(schema_accepts(uni, "\"ééβ😀\""));
    CHECK(schema_accepts(uni, "\"é😀\""));
    CHECK_FALSE(schema_accepts(uni, "\"eβ😀\""));
    CHECK_FALSE(schema_accepts(uni, "\"éβγ😀\""));
    CHECK(schema_accepts(R"({"type": "string", "pattern": "^a{b}$"})", "\"a{b}\""));
    CHECK(schema_accepts(R"({"type": "string", "pattern": "^(?<year>[0-9]{4})-(?:0[1-9]|1[0-2])$"})", "\"2024-12\""));
    CHECK_FALSE(schema_accepts(R"({"type": "string", "pattern": "^(?<year>[0-9]{4})-(?:0[1-9]|1[0-2])$"})", "\"2024-13\""));
    CHECK(schema_accepts(R"({"type": "string", "pattern": "b+"})", R"("aaabbbccc")"));
    CHECK_FALSE(schema_accepts(R"({"type": "string", "pattern": "b+"})", R"("aaaccc")"));
    CHECK(schema_accepts(R"({"pattern": "^[0-9]+$"})", R"("42")"));  // no type: a string by its pattern
    CHECK_FALSE(schema_accepts(R"({"pattern": "^[0-9]+$"})", "42"));
}

TEST_CASE("json_schema: unsupported or malformed patterns are errors naming the construct") {
    const std::pair<const char*, const char*> cases[] = {
        {"^(?=a)b$", "lookaround assertions are not supported"}, {"^(?!a)b$", "lookaround"},
        {"^(?<=a)b$", "lookaround"},                              {"^(a)\\\\1$", "backreferences are not supported"},
        {"^\\\\bword$", "word boundaries are not supported"},     {"^a**$", "nothing to repeat"},
        {"^*a$", "nothing to repeat"},                            {"^{2}a$", "nothing to repeat"},
        {"^(ab", "unbalanced '('"},                               {"^a)$", "unbalanced ')'"},
        {"^[ab$", "unexpected end"},                              {"^a{3,2}$", "numbers out of order"},
        {"^a$b", "only supported at the ends"},                           {"a^b", "only supported at the ends"},
        {"^\\\\p{L}$", "unsupported escape '\\p'"},             {"^[z-a]$", "range out of order"},
        {"^a{99999}$", "repetition count above"},                 {"^[\\\\d-z]$", "a class escape cannot bound a range"},
        {"^\\\\x4$", "expected 2 hex digits"},                    {"^[\\\\x01]$", "only control characters"},
    };
    for (const auto& pattern_and_needle : cases) {
        const std::string pattern = pattern_and_needle.first, needle = pattern_and_needle.second;
        const std::string err = schema_error(std::string(R"({"type": "string", "pattern": ")") + pattern + "\"}");
        CHECK_MESSAGE(err.find("json_schema: pattern: ") == 0, pattern, " -> ", err);
        CHECK_MESSAGE(err.find(needle) != std::string::npos, pattern, " -> ", err);
    }
    CHECK(schema_error(R"({"type": "string", "pattern": 5})").find("'pattern' must be a string") != std::string::npos);
    CHECK(schema_error(std::string(R"({"type": "string", "pattern": ")") + std::string(5000, 'a') + "\"}").find("longer than 4096") != std::string::npos);
    CHECK(schema_error(std::string(R"({"type": "string", "pattern": ")") + std::string(70, '(') + std::string(70, ')') + "\"}").find("nested deeper than 64") != std::string::npos);
}

TEST_CASE("json_schema: sampling under a pattern's grammar gives strings the regex matches") {
    const char* patterns[] = {R"(^[A-Z][a-z]{2,6} \d{2}$)", R"(^(red|green|blue)-[0-9a-f]{4}$)", R"(^\w{1,8}@\w{1,8}\.(com|org)$)"};
    uint64_t seed = 11;
    for (const char* pattern : patterns) {
        const std::string gbnf = llm::json_schema_to_grammar(nlohmann::json{{"type", "string"}, {"pattern", pattern}}.dump());
        bool done = false;
        const std::string text = generate(gbnf, seed++, 80, &done);
        REQUIRE_MESSAGE(done, std::string(pattern), " -> ", text);
        const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
        REQUIRE_MESSAGE(doc.is_string(), text);
        CHECK_MESSAGE(std::regex_search(doc.get<std::string>(), std::regex(pattern)), std::string(pattern), " -> ", text);
    }
}

TEST_CASE("json_schema: llama.cpp's other keywords: $ref pointers, tuples, formats, allOf, extra keys, literals") {
    // Extra keys (additionalProperties next to properties) are never one of the declared names.
    const std::string extra = R"({"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}},
                                  "additionalProperties": {"type": "integer"}})";
    CHECK(schema_accepts(extra, R"({"a": 1, "abc": 2, "b": 3, "": 4})"));
    CHECK(schema_accepts(extra, R"({"ab": 1, "a\"": 2, "x": 3})"));
    CHECK_FALSE(schema_accepts(extra, R"({"a": 1, "a": 2})"));
    CHECK_FALSE(schema_accepts(extra, R"({"x": 1, "ab": 2})"));
    CHECK_FALSE(schema_accepts(extra, R"({"a": 1, "x": "s"})"));
    const std::string long_name = std::string(R"({"properties": {")") + std::string(1025, 'k') + R"(": {}}, "additionalProperties": true})";
    CHECK(schema_error(long_name).find("limited to 1024 characters") != std::string::npos);
    CHECK(schema_accepts(R"({"type": "object", "additionalProperties": false})", "{}"));
    CHECK_FALSE(schema_accepts(R"({"type": "object", "additionalProperties": false})", R"({"a": 1})"));
    // $ref: JSON pointers anywhere in the document, escapes, array indices, the root, nested $defs.
    const std::string refs = R"({
        "properties": {"a/b": {"type": "integer", "minimum": 1}, "list": {"type": "array", "items": [{"type": "null"}, {"const": 7}]}},
        "required": ["x", "y", "z", "w"],
        "additionalProperties": false,
        "allOf": [{"properties": {"x": {"$ref": "#/properties/a~1b"}, "y": {"$ref": "#/properties/list/items/1"},
                                  "z": {"$ref": "#/$defs/hidden"}, "w": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}},
                   "required": ["x", "y", "z", "w"]}],
        "$comment": {"$defs": {"hidden": {"type": "boolean"}}}
    })";
    CHECK(schema_accepts(refs, R"({"x": 3, "y": 7, "z": true, "w": null})"));
    CHECK(schema_accepts(refs, R"({"x": 3, "y": 7, "z": true, "w": {"x": 1, "y": 7, "z": false, "w": null}})"));
    CHECK_FALSE(schema_accepts(refs, R"({"x": 0, "y": 7, "z": true, "w": null})"));
    CHECK_FALSE(schema_accepts(refs, R"({"x": 3, "y": 8, "z": true, "w": null})"));
    CHECK_FALSE(schema_accepts(refs, R"({"x": 3, "y": 7, "z": 1, "w": null})"));
    CHECK(schema_error(R"({"$ref": "#/properties/nope"})").find("unresolved $ref '#/properties/nope'") != std::string::npos);
    CHECK(schema_error(R"({"$ref": "https://example.com/s.json"})").find("only local $ref") != std::string::npos);
    // Tuples: the items array form, prefixItems with items false or an items schema for the rest.
    CHECK(schema_accepts(R"({"items": [{"type": "integer"}, {"type": "string"}]})", R"([1, "a"])"));
    CHECK_FALSE(schema_accepts(R"({"items": [{"type": "integer"}, {"type": "string"}]})", R"([1, "a", 2])"));
    const std::string rest = R"({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}})";
    CHECK(schema_accepts(rest, R"([1, "a", "b"])"));
    CHECK(schema_accepts(rest, "[1]"));
    CHECK_FALSE(schema_accepts(rest, "[1, 2]"));
    CHECK(schema_accepts(R"({"prefixItems": [{"type": "null"}], "items": false})", "[null]"));
    CHECK_FALSE(schema_accepts(R"({"prefixItems": [{"type": "null"}], "items": false})", "[null, null]"));
    CHECK(schema_accepts(R"({"type": "array", "items": false})", "[]"));
    CHECK_FALSE(schema_accepts(R"({"type": "array", "items": false})", "[1]"));
    CHECK(schema_accepts(R"({"type": "array", "items": true, "maxItems": 2})", R"([1, {}])"));
    // Formats: uuid1-5 as uuid, and a format without a type; unknown formats are plain strings.
    const std::string uuid = "\"123e4567-e89b-12d3-a456-426614174000\"";
    CHECK(schema_accepts(R"({"type": "string", "format": "uuid4"})", uuid));
    CHECK(schema_accepts(R"({"format": "uuid"})", uuid));
    CHECK_FALSE(schema_accepts(R"({"format": "uuid"})", "\"123e4567\""));
    CHECK(schema_accepts(R"({"format": "time"})", "\"10:20:30.123+02:00\""));
    CHECK_FALSE(schema_accepts(R"({"format": "time"})", "\"25:20:30Z\""));
    CHECK(schema_accepts(R"({"type": "string", "format": "email"})", "\"not checked\""));
    // minLength/maxLength count characters (not bytes), escapes as one.
    CHECK(schema_accepts(R"({"type": "string", "minLength": 2, "maxLength": 3})", "\"é😀\""));
    CHECK(schema_accepts(R"({"type": "string", "minLength": 2, "maxLength": 3})", R"("\n\"x")"));
    CHECK_FALSE(schema_accepts(R"({"type": "string", "minLength": 2, "maxLength": 3})", "\"é\""));
    // allOf: enums intersect; an anyOf member's properties are optional.
    CHECK(schema_accepts(R"({"allOf": [{"enum": ["a", "b", 3]}, {"enum": [3, "b"]}]})", "\"b\""));
    CHECK(schema_accepts(R"({"allOf": [{"enum": ["a", "b", 3]}, {"enum": [3, "b"]}]})", "3"));
    CHECK_FALSE(schema_accepts(R"({"allOf": [{"enum": ["a", "b", 3]}, {"enum": [3, "b"]}]})", "\"a\""));
    CHECK(schema_error(R"({"allOf": [{"enum": ["a"]}, {"enum": ["b"]}]})").find("no value in common") != std::string::npos);
    const std::string mixed = R"({"allOf": [{"properties": {"id": {"type": "integer"}}, "required": ["id"]},
                                            {"anyOf": [{"properties": {"name": {"type": "string"}}, "required": ["name"]}]}]})";
    CHECK(schema_accepts(mixed, R"({"id": 1})"));
    CHECK(schema_accepts(mixed, R"({"id": 1, "name": "n"})"));
    CHECK_FALSE(schema_accepts(mixed, R"({"name": "n"})"));
    // const and enum are generated as written (number literals kept); a repeated key keeps the last value.
    CHECK(schema_accepts(R"({"enum": [1.50, 1e2, -0, "x\u00e9\n"]})", "1.50"));
    CHECK(schema_accepts(R"({"enum": [1.50, 1e2, -0, "x\u00e9\n"]})", "1e2"));
    CHECK(schema_accepts(R"({"enum": [1.50, 1e2, -0, "x\u00e9\n"]})", "-0"));
    CHECK(schema_accepts(R"({"enum": [1.50, 1e2, -0, "x\u00e9\n"]})", "\"xé\\n\""));
    CHECK_FALSE(schema_accepts(R"({"enum": [1.50, 1e2, -0, "x\u00e9\n"]})", "1.5"));
    CHECK(schema_accepts(R"({"const": {"k": [1.0, true, null]}})", R"({"k":[1.0,true,null]})"));
    CHECK(schema_accepts(R"({"type": "string", "type": "integer"})", "5"));
    CHECK_FALSE(schema_accepts(R"({"type": "string", "type": "integer"})", "\"5\""));
}

TEST_CASE("json_schema: a server request with a pattern and integer bounds answers a document that validates") {
    using namespace testserver;
    ServerProcess server(server_cmd({"-np", "1", "-c", "512"}));
    const json schema = {
        {"type", "object"},
        {"properties", {{"city", {{"type", "string"}, {"pattern", "^[A-Z][a-z]{1,15}$"}}},
                        {"zip", {{"type", "string"}, {"pattern", "^\\d{5}$"}}},
                        {"population", {{"type", "integer"}, {"minimum", 1000}, {"maximum", 99999999}}},
                        {"rank", {{"type", "integer"}, {"exclusiveMinimum", 0}, {"maximum", 10}}}}},
        {"required", {"city", "zip", "population", "rank"}}};
    for (const char* prompt : {"The largest city in France, as JSON:", "A small town in Germany, as JSON:"}) {
        Reply r = post(server.port, "/completion", {{"prompt", prompt}, {"n_predict", 96}, {"temperature", 0}, {"json_schema", schema}});
        REQUIRE_MESSAGE(r.status == 200, r.raw);
        const std::string text = r.body["content"];
        CHECK(r.body["stop_type"] == "eos");
        const json doc = json::parse(text, nullptr, false);
        REQUIRE_MESSAGE(doc.is_object(), text);
        CHECK(doc.size() == 4);
        CHECK_MESSAGE(std::regex_match(doc["city"].get<std::string>(), std::regex("[A-Z][a-z]{1,15}")), text);
        CHECK_MESSAGE(std::regex_match(doc["zip"].get<std::string>(), std::regex("\\d{5}")), text);
        const long long population = doc["population"], rank = doc["rank"];
        CHECK_MESSAGE((population >= 1000 && population <= 99999999), text);
        CHECK_MESSAGE((rank >= 1 && rank <= 10), text);
    }
    Reply bad = post(server.port, "/completion", {{"prompt", "x"}, {"n_predict", 1}, {"json_schema", {{"type", "string"}, {"pattern", "^(?=x)$"}}}});
    CHECK(bad.status == 400);
    CHECK_MESSAGE(bad.raw.find("json_schema: pattern: lookaround assertions are not supported") != std::string::npos, bad.raw);
    Reply empty = post(server.port, "/completion", {{"prompt", "x"}, {"n_predict", 1}, {"json_schema", {{"type", "integer"}, {"minimum", 3}, {"maximum", 2}}}});
    CHECK(empty.status == 400);
    CHECK_MESSAGE(empty.raw.find("no integer lies within minimum and maximum") != std::string::npos, empty.raw);
}
