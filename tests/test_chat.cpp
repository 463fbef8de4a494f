// Chat templates: every case of shared/chat/cases.json (prompts rendered by Hugging Face's
// apply_chat_template from real templates) must come out of chat_render byte for byte, and cases
// where the template raises must throw the template's message.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "../llm.hpp"

using nlohmann::json;

namespace {

std::string shared_dir() {
    const char* env = std::getenv("LLM_SHARED");
    return env && *env ? env : "../shared";
}

std::string read_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE_MESSAGE(f.good(), "cannot open " << path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::vector<llm::ChatMessage> to_messages(const json& arr) {
    std::vector<llm::ChatMessage> msgs;
    for (auto& m : arr) msgs.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    return msgs;
}

} // namespace

TEST_CASE("chat: every shared case renders byte for byte") {
    const std::string dir = shared_dir() + "/chat";
    const json data = json::parse(read_text(dir + "/cases.json"));

    std::map<std::string, std::vector<llm::ChatMessage>> conversations;
    for (auto& c : data.at("conversations")) conversations[c.at("name")] = to_messages(c.at("messages"));

    std::map<std::string, llm::ChatFamily> family_of;  // template file -> detected family
    int total = 0, passed = 0;
    for (auto& c : data.at("cases")) {
        const std::string tpl = c.at("template"), conv = c.at("conversation");
        const bool agp = c.at("add_generation_prompt");
        CAPTURE(tpl);
        CAPTURE(conv);
        CAPTURE(agp);
        if (!family_of.count(tpl)) family_of[tpl] = llm::chat_detect_family(read_text(dir + "/templates/" + tpl));
        const llm::ChatFamily fam = family_of[tpl];
        REQUIRE_MESSAGE(fam != llm::ChatFamily::Unknown, "template not recognized: " << tpl);

        const auto& msgs = conversations.at(conv);
        const std::string bos = c.at("bos_token"), eos = c.at("eos_token");
        total++;
        if (c.contains("error")) {
            std::string what;
            try {
                llm::chat_render(fam, msgs, agp, bos, eos, "29 Nov 2026");
            } catch (const llm::Error& e) {
                what = e.what();
            }
            CHECK(what == c.at("error").get<std::string>());
            passed += what == c.at("error").get<std::string>();
        } else {
            const std::string got = llm::chat_render(fam, msgs, agp, bos, eos, "29 Nov 2026");
            CHECK(got == c.at("expected").get<std::string>());
            passed += got == c.at("expected").get<std::string>();
        }
    }
    MESSAGE("chat cases passed: " << passed << " / " << total);
    CHECK(total == 60);
    CHECK(passed == total);
}

TEST_CASE("chat: detection picks the right family for each shared template") {
    const std::string dir = shared_dir() + "/chat/templates/";
    const std::pair<const char*, llm::ChatFamily> want[] = {
        {"HuggingFaceTB-SmolLM3-3B.jinja", llm::ChatFamily::SmolLM3},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", llm::ChatFamily::Qwen25},
        {"Qwen-Qwen3-0.6B.jinja", llm::ChatFamily::Qwen3},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", llm::ChatFamily::DeepSeekR1Switch},
        {"deepseek-ai-DeepSeek-V3.1.jinja", llm::ChatFamily::DeepSeekV31},
        {"google-gemma-2-2b-it.jinja", llm::ChatFamily::Gemma2},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", llm::ChatFamily::Llama31},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", llm::ChatFamily::Llama32},
        {"microsoft-Phi-3.5-mini-instruct.jinja", llm::ChatFamily::Phi3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", llm::ChatFamily::MistralNemo},
    };
    for (auto& w : want) {
        const std::string file = w.first;
        CAPTURE(file);
        CHECK(llm::chat_family_name(llm::chat_detect_family(read_text(dir + file))) == llm::chat_family_name(w.second));
    }
    CHECK(llm::chat_detect_family("") == llm::ChatFamily::Unknown);
    CHECK(llm::chat_detect_family("{{ messages }}") == llm::ChatFamily::Unknown);
}

TEST_CASE("chat: family names round-trip and unknown names throw") {
    for (auto& name : llm::chat_family_names()) {
        CAPTURE(name);
        CHECK(llm::chat_family_name(llm::chat_family_from_name(name)) == name);
    }
    CHECK(llm::chat_family_from_name("ChatML") == llm::ChatFamily::ChatML);
    CHECK(llm::chat_family_from_name("deepseek3") == llm::ChatFamily::DeepSeekV3);
    CHECK(llm::chat_family_from_name("llama3") == llm::ChatFamily::Llama3);
    CHECK_THROWS_AS(llm::chat_family_from_name("no-such-template"), llm::Error);
}

TEST_CASE("chat: options beyond the shared cases") {
    using llm::ChatFamily;
    const std::vector<llm::ChatMessage> sys_user = {{"system", "Be brief."}, {"user", "Hi"}};
    llm::ChatOptions o;
    o.bos_token = "<bos>";

    SUBCASE("gemma 2 folds the system turn like llama-server when asked") {
        CHECK_THROWS_WITH_AS(llm::chat_render(ChatFamily::Gemma2, sys_user, o), "System role not supported", llm::Error);
        o.fold_system = true;
        CHECK(llm::chat_render(ChatFamily::Gemma2, sys_user, o) ==
              "<bos><start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\n");
    }
    SUBCASE("gemma 3 folds the system turn itself") {
        CHECK(llm::chat_render(ChatFamily::Gemma3, sys_user, o) ==
              "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
    }
    SUBCASE("roles must alternate") {
        const std::vector<llm::ChatMessage> two_users = {{"user", "a"}, {"user", "b"}};
        CHECK_THROWS_WITH_AS(llm::chat_render(ChatFamily::Gemma3, two_users, o),
                             "Conversation roles must alternate user/assistant/user/assistant/...", llm::Error);
        CHECK_THROWS_AS(llm::chat_render(ChatFamily::MistralNemo, two_users, o), llm::Error);
    }
    SUBCASE("enable_thinking") {
        const std::vector<llm::ChatMessage> user = {{"user", "Hi"}};
        o.bos_token = "";
        o.enable_thinking = 0;
        CHECK(llm::chat_render(ChatFamily::Qwen3, user, o) ==
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
        o.enable_thinking = 1;
        CHECK(llm::chat_render(ChatFamily::DeepSeekR1Switch, user, o) == "<｜User｜>Hi<｜Assistant｜><think>\n");
        CHECK(llm::chat_render(ChatFamily::DeepSeekV31, user, o) == "<｜User｜>Hi<｜Assistant｜><think>");
    }
    SUBCASE("qwen3 keeps reasoning only after the last user query") {
        const std::vector<llm::ChatMessage> msgs = {
            {"user", "q1"}, {"assistant", "<think>r1</think>a1"}, {"user", "q2"}, {"assistant", "<think>\nr2\n</think>\n\na2"}};
        o.bos_token = "";
        o.add_generation_prompt = false;
        CHECK(llm::chat_render(ChatFamily::Qwen3, msgs, o) ==
              "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
              "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");
    }
    SUBCASE("llama 3.2 prints the caller's date, 3.1 its fixed one") {
        o.bos_token = "";
        o.date_string = "01 Jan 2030";
        CHECK(llm::chat_render(ChatFamily::Llama32, sys_user, o).find("Today Date: 01 Jan 2030\n\nBe brief.") != std::string::npos);
        CHECK(llm::chat_render(ChatFamily::Llama31, sys_user, o).find("Today Date: 26 Jul 2024\n\nBe brief.") != std::string::npos);
    }
    SUBCASE("an empty conversation is an error") {
        CHECK_THROWS_AS(llm::chat_render(ChatFamily::ChatML, {}, o), llm::Error);
    }
}
