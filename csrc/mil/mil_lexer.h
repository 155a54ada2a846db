/* mil_lexer.h -- tokens of MIL text, with 1-based line and column.
 *
 * The text is a byte range, not a C string: the lexer never reads at or past
 * text + len. Columns count bytes (a tab is one column). */
#ifndef ORION_MIL_LEXER_H
#define ORION_MIL_LEXER_H

#include <stddef.h>

typedef enum mil_tok_kind {
    TOK_EOF = 0,
    TOK_IDENT,     /* [A-Za-z_][A-Za-z0-9_]* */
    TOK_NUMBER,    /* 12, 0.5, 1e-4, 0x1p-3 (no sign: '-' is its own token) */
    TOK_STRING,    /* "..." with \" \\ \n \t escapes; the token spans the quotes */
    TOK_PUNCT,     /* one of ( ) [ ] { } < > , = ; - */
    TOK_ARROW,     /* -> */
    TOK_ERROR      /* a byte that starts no token; `error` says why */
} mil_tok_kind;

typedef struct mil_token {
    mil_tok_kind kind;
    const char *start;   /* into the text */
    size_t len;
    char punct;          /* TOK_PUNCT: the character */
    int line, column;
    const char *error;   /* TOK_ERROR: what was wrong, a static string */
} mil_token;

typedef struct mil_lexer {
    const char *text;
    size_t len;
    size_t pos;
    int line, column;
} mil_lexer;

void mil_lexer_init(mil_lexer *lx, const char *text, size_t len);
/* Skips blanks and // comments, then scans one token. */
mil_token mil_lexer_next(mil_lexer *lx);

#endif
