/* Built-in chat templates (Llama-3, Mistral [INST], ChatML as used by
 * Qwen2, Phi-3): messages -> the prompt text the model was tuned on, ending
 * with the assistant's generation prompt. They reproduce the Jinja templates
 * of the families' tokenizer_config.json for system/user/assistant text
 * messages; Jinja itself is not interpreted. */
#ifndef DSC_SERVE_CHAT_TEMPLATE_H
#define DSC_SERVE_CHAT_TEMPLATE_H

#include <stdint.h>

#include "dsc/status.h"
#include "dsc/tokenizer.h"

typedef struct serve_chat_template serve_chat_template;
typedef struct serve_message serve_message;

/* By name ("llama-3", "mistral", "chatml", "phi-3"); NULL when unknown. */
const serve_chat_template *serve_chat_template_find(const char *name);
/* From the tokenizer's special tokens (<|start_header_id|>, [INST],
 * <|im_start|>, <|assistant|>); NULL when none matches or tok is NULL. */
const serve_chat_template *serve_chat_template_detect(const dsc_tokenizer *tok);
const char *serve_chat_template_name(const serve_chat_template *t);
/* The text that ends an assistant turn ("<|eot_id|>", "</s>", ...). */
const char *serve_chat_template_end(const serve_chat_template *t);
/* "llama-3, mistral, chatml, phi-3" */
const char *serve_chat_template_names(void);
/* Renders n messages (roles system, user, assistant) into *out (malloc'd).
 * A role the template cannot place (a system message after the first, two
 * user turns in a row for mistral) is DSC_ERR_INVALID naming the message. */
dsc_status serve_chat_render(const serve_chat_template *t, const serve_message *m, int32_t n, char **out);

#endif
