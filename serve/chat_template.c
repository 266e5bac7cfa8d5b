/* The built-in chat templates. Each is a small function of the message list
 * that follows its family's Jinja template (tokenizer_config.json of
 * Meta-Llama-3-8B-Instruct, Mistral-7B-Instruct-v0.2, Qwen2-7B-Instruct,
 * Phi-3-mini-4k-instruct) for text messages with add_generation_prompt.
 * Mistral's template has no system role; like Mistral's later templates,
 * a leading system message is prepended to the first user message. */
#include "serve/chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"
#include "serve/strbuf.h"

typedef dsc_status (*render_fn)(const serve_message *m, int32_t n, serve_buf *b);

struct serve_chat_template {
    const char *name;
    const char *end;    /* end of an assistant turn */
    const char *marker; /* a special token whose presence selects the template */
    render_fn render;
};

static bool is_role(const serve_message *m, const char *role) {
    return strcmp(m->role, role) == 0;
}

/* Jinja's `trim`: without leading and trailing whitespace. */
static void add_trimmed(serve_buf *b, const char *s) {
    size_t n = strlen(s);
    while (n && strchr(" \t\n\r", s[n - 1]))
        n--;
    while (n && strchr(" \t\n\r", *s)) {
        s++;
        n--;
    }
    serve_buf_add(b, s, n);
}

static dsc_status render_llama3(const serve_message *m, int32_t n, serve_buf *b) {
    serve_buf_puts(b, "<|begin_of_text|>");
    for (int32_t i = 0; i < n; i++) {
        serve_buf_printf(b, "<|start_header_id|>%s<|end_header_id|>\n\n", m[i].role);
        add_trimmed(b, m[i].content);
        serve_buf_puts(b, "<|eot_id|>");
    }
    serve_buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return NULL;
}

static dsc_status render_mistral(const serve_message *m, int32_t n, serve_buf *b) {
    const char *system = NULL;
    int32_t first = 0;
    if (n > 0 && is_role(&m[0], "system")) {
        system = m[0].content;
        first = 1;
    }
    serve_buf_puts(b, "<s>");
    for (int32_t i = first; i < n; i++) {
        bool user_turn = (i - first) % 2 == 0;
        if (is_role(&m[i], "system"))
            return dsc_error(DSC_ERR_INVALID,
                             "messages[%d]: the mistral template takes a system message only first", i);
        if (is_role(&m[i], "user") != user_turn)
            return dsc_error(DSC_ERR_INVALID,
                             "messages[%d]: the mistral template needs roles alternating user/assistant/user/...",
                             i);
        if (user_turn) {
            serve_buf_puts(b, "[INST] ");
            if (system && i == first) serve_buf_printf(b, "%s\n\n", system);
            serve_buf_printf(b, "%s [/INST]", m[i].content);
        } else {
            serve_buf_printf(b, "%s</s>", m[i].content);
        }
    }
    return NULL;
}

static dsc_status render_chatml(const serve_message *m, int32_t n, serve_buf *b) {
    if (n == 0 || !is_role(&m[0], "system"))
        serve_buf_puts(b, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
    for (int32_t i = 0; i < n; i++)
        serve_buf_printf(b, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
    serve_buf_puts(b, "<|im_start|>assistant\n");
    return NULL;
}

static dsc_status render_phi3(const serve_message *m, int32_t n, serve_buf *b) {
    for (int32_t i = 0; i < n; i++)
        serve_buf_printf(b, "<|%s|>\n%s<|end|>\n", m[i].role, m[i].content);
    serve_buf_puts(b, "<|assistant|>\n");
    return NULL;
}

static const serve_chat_template templates[] = {
    {"llama-3", "<|eot_id|>", "<|start_header_id|>", render_llama3},
    {"mistral", "</s>", "[INST]", render_mistral},
    {"chatml", "<|im_end|>", "<|im_start|>", render_chatml},
    {"phi-3", "<|end|>", "<|assistant|>", render_phi3},
};
enum { N_TEMPLATES = sizeof templates / sizeof templates[0] };

const serve_chat_template *serve_chat_template_find(const char *name) {
    for (int i = 0; i < N_TEMPLATES; i++)
        if (strcmp(templates[i].name, name) == 0) return &templates[i];
    return NULL;
}

const serve_chat_template *serve_chat_template_detect(const dsc_tokenizer *tok) {
    if (!tok) return NULL;
    for (int i = 0; i < N_TEMPLATES; i++)
        if (dsc_tokenizer_token_id(tok, templates[i].marker) >= 0) return &templates[i];
    return NULL;
}

const char *serve_chat_template_name(const serve_chat_template *t) {
    return t->name;
}

const char *serve_chat_template_end(const serve_chat_template *t) {
    return t->end;
}

const char *serve_chat_template_names(void) {
    return "llama-3, mistral, chatml, phi-3";
}

dsc_status serve_chat_render(const serve_chat_template *t, const serve_message *m, int32_t n, char **out) {
    serve_buf b = {0};
    for (int32_t i = 0; i < n; i++)
        if (!is_role(&m[i], "system") && !is_role(&m[i], "user") && !is_role(&m[i], "assistant"))
            return dsc_error(DSC_ERR_INVALID, "messages[%d].role: \"%s\" is not system, user or assistant", i,
                             m[i].role);
    dsc_status s = t->render(m, n, &b);
    if (!s && b.oom) s = dsc_error(DSC_ERR_NOMEM, "chat template %s: prompt text", t->name);
    if (s) {
        serve_buf_free(&b);
        return s;
    }
    *out = b.p ? b.p : calloc(1, 1);
    return *out ? NULL : dsc_error(DSC_ERR_NOMEM, "chat template %s: prompt text", t->name);
}
