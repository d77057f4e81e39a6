# Writes OUT, a C file holding the bytes of IN as `const char NAME[]` (NUL-terminated) and its length
# `const size_t NAME_len`: the web page goes inside the binary with no build step but this one.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){24})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp" "/* generated from ${IN} by embed.cmake: do not edit */\n#include <stddef.h>\n"
     "const char ${NAME}[] = {\n${bytes}0x00};\nconst size_t ${NAME}_len = ${len};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
