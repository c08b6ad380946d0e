// Package docs holds Quill's reference documentation; its tests check the README's length, every relative link, and every decision record's status line and its row in the index.
package docs
